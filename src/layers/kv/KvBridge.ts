/**
 * Live KvBridge: a ZMQ SUB per data-parallel rank on that rank's KV-event endpoint (the configured one,
 * TCP port + rank; connects when the engine binds, binds when the engine connects), per-rank seq checks,
 * gap filling through that rank's replay ROUTER when one is configured (a DEALER sends ["", seq8]; replies
 * in both the 3- and 4-frame layouts), and a bounded LineQueue drained by the kvcached writer. Batches are
 * tagged with the rank of the endpoint they came from, so 2-element batches (no rank inside) stay apart.
 * The reader only ever does synchronous pushes, so neither kvcached nor a replay can stall it.
 * Metrics are registered on the shared registry here, so services/observability/Metrics.ts stays untouched; the
 * production layer renders the plan from Config itself (as EngineClient does).
 */
import { Effect, Layer, type Scope } from "effect"
import { Counter, Gauge, type Registry } from "prom-client"
import * as zmq from "zeromq"
import { Config } from "../../services/config/Config.ts"
import { EnginePlan, type KvEventsEndpoint } from "../../services/engine/Engine.ts"
import { KvBridge, type KvBridgeService, type KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import {
  checkSeq,
  decodeMessage,
  decodeReplayReply,
  type KvBatch,
  rankEndpoint,
  seqFrame
} from "../../services/kv/KvEvents.ts"
import {
  batchRecord,
  hello,
  type KvRecordBody,
  type NodeIdentity,
  type Resync,
  recordBytes,
  resyncRecord
} from "../../services/kv/KvWire.ts"
import { METRIC_PREFIX, Metrics, type MetricsService, setCounter } from "../../services/observability/Metrics.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { runLink } from "./kvcachedClient.ts"
import { KvQueue, type QueuedRecord } from "./queue.ts"

/** `kv.max_queue_bytes`'s default: minutes of a busy engine's events, a bounded share of the agent's memory. */
export const DEFAULT_MAX_QUEUE_BYTES = 32 * 1024 * 1024

export interface BridgeOptions {
  readonly kvEvents: KvEventsEndpoint
  readonly uds: string
  readonly identity: NodeIdentity
  readonly blockSize: number
  /** This agent run's id (Hello.epoch). */
  readonly epoch: string
  /** Bytes of records held while kvcached is slow or away, acknowledged or not (default 32 MiB). */
  readonly maxQueueBytes?: number
  readonly backoffMaxMs?: number
  readonly replayTimeoutMs?: number
}

/** The address to connect to for an endpoint the engine binds (`tcp://*:P` -> `tcp://127.0.0.1:P`). */
export const connectAddress = (endpoint: string): string =>
  endpoint.replace(/^tcp:\/\/(\*|\[::\]|::|0\.0\.0\.0):/, "tcp://127.0.0.1:")

type Mutable<T> = { -readonly [K in keyof T]: T[K] }

const disabledStatus = (epoch: string, reason: string): KvBridgeStatus => ({
  enabled: false,
  disabledReason: reason,
  subscribed: false,
  kvcachedConnected: false,
  forwarded: 0,
  dropped: 0,
  gaps: 0,
  replayed: 0,
  resyncs: 0,
  queued: 0,
  queuedBytes: 0,
  lastSeq: undefined,
  unknownEvents: 0,
  unknownKeys: 0,
  lastError: undefined,
  epoch
})

/** Every batch the replay ROUTER holds from `from` on, decoded. Fails on timeout or a bad frame. */
const fetchReplay = (endpoint: string, topic: string, from: bigint, timeoutMs: number) =>
  Effect.tryPromise({
    try: async (signal) => {
      const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: timeoutMs })
      // Interruption closes the dealer, which rejects the pending receive.
      const onAbort = () => dealer.close()
      signal.addEventListener("abort", onAbort, { once: true })
      try {
        dealer.connect(endpoint)
        await dealer.send([new Uint8Array(0), seqFrame(from)])
        const out: Array<KvBatch> = []
        for (;;) {
          const r = decodeReplayReply(await dealer.receive(), topic)
          if (r.end) return out
          if (r.ok) out.push(r.batch)
          else if (r.seq === undefined) throw new Error(r.error)
        }
      } finally {
        signal.removeEventListener("abort", onAbort)
        if (!dealer.closed) dealer.close()
      }
    },
    catch: (err) => new Error(`replay from ${endpoint}: ${err instanceof Error ? err.message : String(err)}`)
  })

/** One rank's stream: its endpoints, the seq it owes next, the batches held while its replay runs. */
interface RankStream {
  readonly rank: number
  readonly endpoint: string
  readonly replayAt: string | undefined
  expected: bigint | undefined
  holding: Array<KvBatch> | undefined
}

/** The running bridge; everything it opens is closed with the caller's scope. */
export const make = (o: BridgeOptions): Effect.Effect<KvBridgeService, never, Scope.Scope> =>
  Effect.gen(function* () {
    const st: Mutable<KvBridgeStatus> = { ...disabledStatus(o.epoch, ""), enabled: true, disabledReason: undefined }
    const queue = new KvQueue<KvRecordBody>(o.maxQueueBytes ?? DEFAULT_MAX_QUEUE_BYTES)
    const { endpoint, engineBinds, replayEndpoint, topic } = o.kvEvents
    const dpSize = Math.max(1, o.kvEvents.dpSize ?? 1)
    const replayTimeoutMs = o.replayTimeoutMs ?? 2_000
    const queued = (record: KvRecordBody, dpRank: number, fromSeq: bigint, nextSeq: bigint) => ({
      record,
      batch: record.type === "Batch",
      dpRank,
      fromSeq,
      nextSeq,
      bytes: recordBytes(record)
    })
    const resyncOf = (r: Resync): QueuedRecord<KvRecordBody> => queued(resyncRecord(r), r.dpRank, r.fromSeq, r.toSeq)
    // Replays started by a message (or by the end of another replay, which may find a new gap in what it
    // held); they run beside the readers, never in their way.
    const fibers: Array<Effect.Effect<void, never, Scope.Scope>> = []
    const runQueued: Effect.Effect<void, never, Scope.Scope> = Effect.suspend(() => {
      const next = fibers.shift()
      return next === undefined ? Effect.void : Effect.andThen(Effect.forkScoped(next), runQueued)
    })

    let decodeDrops = 0
    const push = (q: QueuedRecord<KvRecordBody>) => {
      queue.push(q)
      st.dropped = queue.dropped + decodeDrops
    }
    const forward = (r: RankStream, b: KvBatch) => {
      r.expected = b.seq + 1n
      push(queued(batchRecord(b), r.rank, b.seq, b.seq + 1n))
    }
    const resync = (re: Resync) => {
      st.resyncs++
      push(resyncOf(re))
    }

    // After a replay: forward it if it covers [from, until) exactly, else say the range is lost.
    const finishReplay = (r: RankStream, from: bigint, gap: boolean, got: ReadonlyArray<KvBatch> | Error) => {
      const held = r.holding ?? []
      r.holding = undefined
      const until = (held[0] as KvBatch).seq
      const inRange =
        got instanceof Error
          ? []
          : got.filter((b) => b.seq >= from && b.seq < until).map((b) => ({ ...b, dpRank: r.rank }))
      const complete = inRange.length === Number(until - from) && inRange.every((b, i) => b.seq === from + BigInt(i))
      if (got instanceof Error) st.lastError = got.message
      if (complete) {
        for (const b of inRange) forward(r, b)
        if (gap) st.replayed++
      } else if (gap) resync({ reason: "gap", dpRank: r.rank, fromSeq: from, toSeq: until })
      r.expected = until
      for (const b of held) accept(r, b)
    }

    const startReplay = (r: RankStream, at: string, from: bigint, trigger: KvBatch, gap: boolean) => {
      r.holding = [trigger]
      fibers.push(
        fetchReplay(at, topic, from, replayTimeoutMs).pipe(
          Effect.catch((e: Error) => Effect.succeed(e)),
          Effect.flatMap((got) => Effect.sync(() => finishReplay(r, from, gap, got))),
          Effect.andThen(runQueued)
        )
      )
    }

    const accept = (r: RankStream, b: KvBatch) => {
      if (r.holding !== undefined) {
        r.holding.push(b)
        return
      }
      const v = checkSeq(r.expected, b.seq)
      switch (v.kind) {
        case "next":
          return forward(r, b)
        case "join":
          // Hello already tells kvcached to start over, so batches from before we listened are only a bonus.
          if (v.missed && r.replayAt !== undefined) return startReplay(r, r.replayAt, 0n, b, false)
          return forward(r, b)
        case "gap":
          st.gaps++
          if (r.replayAt !== undefined) return startReplay(r, r.replayAt, v.from, b, true)
          resync({ reason: "gap", dpRank: r.rank, fromSeq: v.from, toSeq: v.to })
          return forward(r, b)
        case "restart":
          resync({ reason: "restart", dpRank: r.rank, fromSeq: v.from, toSeq: v.to })
          return forward(r, b)
      }
    }

    const onMessage = (r: RankStream, frames: ReadonlyArray<Uint8Array>) => {
      const d = decodeMessage(frames)
      if (d.ok) {
        st.lastSeq = d.batch.seq.toString()
        st.unknownEvents += d.batch.unknownTypes
        st.unknownKeys += d.batch.unknownKeys
        // The endpoint says which rank this is; a 2-element batch carries no rank of its own.
        return accept(r, { ...d.batch, dpRank: r.rank })
      }
      st.lastError = `undecodable KV event message: ${d.error}`
      if (d.seq === undefined || r.holding !== undefined) return
      // The batch's events are lost; its seq still counts, so no gap is reported for it as well.
      decodeDrops++
      st.lastSeq = d.seq.toString()
      r.expected = d.seq + 1n
      resync({ reason: "decode", dpRank: r.rank, fromSeq: d.seq, toSeq: d.seq + 1n })
    }

    let subscribedRanks = 0
    const readRank = (rank: number) =>
      Effect.gen(function* () {
        const at = rankEndpoint(endpoint, rank)
        const replay = replayEndpoint === undefined ? undefined : rankEndpoint(replayEndpoint, rank)
        if (at === undefined || (replayEndpoint !== undefined && replay === undefined)) {
          st.lastError = `kv events: cannot offset ${endpoint} for DP rank ${rank} (only tcp:// and inproc:// can be)`
          return
        }
        const r: RankStream = {
          rank,
          endpoint: at,
          replayAt: replay === undefined ? undefined : connectAddress(replay),
          expected: undefined,
          holding: undefined
        }
        const sub = yield* Effect.acquireRelease(
          Effect.sync(() => new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 100_000 })),
          (s) => Effect.sync(() => s.close())
        )
        sub.subscribe(topic)
        const open = engineBinds
          ? Effect.sync(() => sub.connect(connectAddress(at)))
          : Effect.tryPromise(() => sub.bind(at))
        for (let failures = 1; ; failures++) {
          const res = yield* Effect.result(open)
          if (res._tag === "Success") break
          st.lastError = `kv events ${at}: ${String(res.failure)}`
          if (failures === 1) yield* Effect.logError("kv events: cannot bind the endpoint; retrying", { endpoint: at })
          yield* Effect.sleep(jitteredBackoffMs(failures, 5_000, Math.random()))
        }
        st.subscribed = ++subscribedRanks === dpSize
        yield* Effect.logInfo("kv events: subscribed", {
          endpoint: at,
          mode: engineBinds ? "connect" : "bind",
          topic,
          dpRank: rank
        })
        for (;;) {
          const frames = yield* Effect.tryPromise(() => sub.receive())
          yield* Effect.sync(() => onMessage(r, frames))
          yield* runQueued
        }
      }).pipe(
        Effect.catch((e) =>
          Effect.sync(() => {
            st.subscribed = false
            st.lastError = `kv events reader of DP rank ${rank} stopped: ${String(e)}`
          })
        )
      )
    for (let rank = 0; rank < dpSize; rank++) yield* Effect.forkScoped(readRank(rank))

    yield* Effect.forkScoped(
      runLink({
        path: o.uds,
        queue,
        hello: hello(o.identity, { epoch: o.epoch, blockSize: o.blockSize, dpSize }),
        resync: (r) => {
          st.resyncs++
          return resyncOf(r)
        },
        backoffMaxMs: o.backoffMaxMs ?? 5_000,
        onConnected: (up, err) => {
          st.kvcachedConnected = up
          if (err !== undefined) st.lastError = `kvcached ${o.uds}: ${err}`
        },
        onForwarded: (n) => {
          st.forwarded += n
        }
      })
    )

    return {
      status: Effect.sync(() => ({
        ...st,
        queued: queue.batches,
        queuedBytes: queue.bytes,
        dropped: queue.dropped + decodeDrops
      }))
    } satisfies KvBridgeService
  })

const counter = (registry: Registry, name: string, help: string): Counter =>
  (registry.getSingleMetric(METRIC_PREFIX + name) as Counter | undefined) ??
  new Counter({ name: METRIC_PREFIX + name, help, registers: [registry] })
const gauge = (registry: Registry, name: string, help: string): Gauge =>
  (registry.getSingleMetric(METRIC_PREFIX + name) as Gauge | undefined) ??
  new Gauge({ name: METRIC_PREFIX + name, help, registers: [registry] })

/** The bridge's series, mirrored from its status at every scrape. */
export const registerMetrics = (m: MetricsService, status: Effect.Effect<KvBridgeStatus>) => {
  const r = m.registry
  const forwarded = counter(r, "kv_events_forwarded_total", "KV-event batches cgn-kvcached acknowledged")
  const dropped = counter(r, "kv_events_dropped_total", "KV-event batches lost (queue overflow, undecodable)")
  const gaps = counter(r, "kv_event_gaps_total", "Sequence gaps on the engine's KV-event stream")
  const resyncs = counter(r, "kv_resyncs_total", "Resync records sent to cgn-kvcached")
  const connected = gauge(r, "kvcached_connected", "1 while connected to cgn-kvcached")
  const queued = gauge(r, "kv_events_queued", "KV-event batches waiting for cgn-kvcached")
  const queuedBytes = gauge(r, "kv_events_queued_bytes", "Bytes held for cgn-kvcached (unsent or unacknowledged)")
  return m.onCollect(
    Effect.map(status, (s) => {
      setCounter(forwarded, s.forwarded)
      setCounter(dropped, s.dropped)
      setCounter(gaps, s.gaps)
      setCounter(resyncs, s.resyncs)
      connected.set(s.kvcachedConnected ? 1 : 0)
      queued.set(s.queued)
      queuedBytes.set(s.queuedBytes)
    })
  )
}

/** A bridge that does nothing and says why. */
export const disabled = (reason: string): KvBridgeService => {
  const s = disabledStatus("", reason)
  return { status: Effect.succeed(s) }
}

/** The bridge from explicit options (tests), with its metrics. */
export const layerWith = (o: BridgeOptions): Layer.Layer<KvBridge, never, Metrics> =>
  Layer.effect(
    KvBridge,
    Effect.gen(function* () {
      const bridge = yield* make(o)
      yield* registerMetrics(yield* Metrics, bridge.status)
      return bridge
    })
  )

/** Production: `[kv]` and the engine's plan decide; off unless `[kv].events`, an event source and `[kv].uds`. */
export const layer: Layer.Layer<KvBridge, never, Config | EnginePlan | Metrics> = Layer.effect(
  KvBridge,
  Effect.gen(function* () {
    const config = yield* Config
    const kvEvents = (yield* EnginePlan).kvEvents
    if (!config.kv.events) return disabled("[kv].events is off")
    if (kvEvents === undefined) return disabled(`engine ${config.engine.kind} publishes no KV events`)
    const uds = config.kv.uds
    if (uds === undefined) {
      yield* Effect.logWarning("kv events are on but [kv].uds is not set: nothing forwards them to kvcached")
      return disabled("[kv].uds is not set")
    }
    const bridge = yield* make({
      kvEvents,
      uds,
      identity: {
        node_id: config.agent.node_id,
        cluster: config.cluster.name,
        model: config.model.served_name,
        engine: config.engine.kind
      },
      blockSize: config.kv.block_size,
      maxQueueBytes: config.kv.max_queue_bytes,
      epoch: globalThis.crypto.randomUUID()
    })
    yield* registerMetrics(yield* Metrics, bridge.status)
    return bridge
  })
)
