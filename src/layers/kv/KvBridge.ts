/**
 * Live KvBridge: one reader per data-parallel rank on that rank's KV-event endpoint (the configured one,
 * TCP port + rank; rankSubscriber.ts), each message sequenced per rank and gaps replayed
 * (rankSequencer.ts, replayFetch.ts), into a bounded KvQueue (services/kv/KvQueue.ts) drained by the kvcached link
 * (kvcachedClient.ts). This module wires them, keeps the status and builds the layers; the production
 * layer takes `[kv]` from Config and the event endpoints from the EnginePlan. Metrics: kvBridgeMetrics.ts.
 */
import { Effect, type Fiber, Layer, Scope, Stream } from "effect"
import { Config } from "../../services/config/Config.ts"
import { EnginePlan, type KvEventsEndpoint } from "../../services/engine/Engine.ts"
import { EngineProcess, type EngineProcessService } from "../../services/engine/EngineProcess.ts"
import { KvBridge, type KvBridgeService, type KvBridgeStatus } from "../../services/kv/KvBridge.ts"
import { rankEndpoint, subscriberHighWaterMark } from "../../services/kv/KvEvents.ts"
import { KvQueue } from "../../services/kv/KvQueue.ts"
import { hello, type NodeIdentity } from "../../services/kv/KvWire.ts"
import { Metrics } from "../../services/observability/Metrics.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { registerMetrics } from "./kvBridgeMetrics.ts"
import { runLink, stopLink } from "./kvcachedClient.ts"
import * as OverflowLog from "./overflowLog.ts"
import { type MutableStatus, makeSequencer, type QueuedBody, type RankStream, resyncOf } from "./rankSequencer.ts"
import { connectAddress, maxFrameBytes, readRank } from "./rankSubscriber.ts"
import { retryForever } from "./retrying.ts"

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
  /** The cap of the reconnect backoff, of the kvcached link and of each rank's reader (default 5 s). */
  readonly backoffMaxMs?: number
  readonly replayTimeoutMs?: number
}

export const disabledStatus = (epoch: string, reason: string): KvBridgeStatus => ({
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
  ranks: [],
  unknownEvents: 0,
  unknownKeys: 0,
  kvcachedStateLosses: 0,
  lastError: undefined,
  lastBatchError: undefined,
  epoch
})

export { heldAtStop } from "./kvcachedClient.ts"

/** The running bridge; everything it opens is closed with the caller's scope. */
export const make = (o: BridgeOptions): Effect.Effect<LiveBridge, never, Scope.Scope> =>
  Effect.gen(function* () {
    const st: MutableStatus = { ...disabledStatus(o.epoch, ""), enabled: true, disabledReason: undefined }
    const maxQueueBytes = o.maxQueueBytes ?? DEFAULT_MAX_QUEUE_BYTES
    const queue = new KvQueue<QueuedBody>(maxQueueBytes)
    const { endpoint, engineBinds, replayEndpoint, topic } = o.kvEvents
    const dpSize = Math.max(1, o.kvEvents.dpSize ?? 1)
    const sequencer = makeSequencer(st, queue, topic, o.replayTimeoutMs ?? 2_000)
    // Drops were only counted (status, metric): the log says when they start, go on, and end.
    const overflow = yield* OverflowLog.make(queue, () => ({ uds: o.uds, kvcachedConnected: st.kvcachedConnected }))
    queue.onOverflow = overflow.dropped
    // Added before the readers are forked, so it runs once they are stopped: the link (forked detached, ended here
    // within kvcachedClient.ts's STOP_BOUND_MS, so a wedged kvcached cannot hold the stop up) is given what kvcached
    // acknowledges meanwhile; what it never did ends with this agent run, and the log says how much.
    let link: Fiber.Fiber<void> | undefined
    let progressed: (() => void) | undefined
    const onProgress = (wake: (() => void) | undefined) => {
      progressed = wake
    }
    const connected = () => st.kvcachedConnected
    yield* Effect.addFinalizer(() =>
      link === undefined ? Effect.void : stopLink(link, { uds: o.uds, queue, connected, onProgress })
    )

    const backoffMaxMs = o.backoffMaxMs ?? 5_000
    // lastError is what is failing now, per part (the kvcached link, each rank's reader): a part that recovers
    // takes its error with it, so /status never shows an old failure as if it were current.
    const faults = new Map<string, string>()
    const fault = (part: string, error: string | undefined) => {
      if (error === undefined) faults.delete(part)
      else faults.set(part, error)
      st.lastError = faults.size === 0 ? undefined : [...faults.values()].join("; ")
    }
    // Replays run in the bridge's scope, not in a reader's: a reader that fails and is restarted must not take
    // a replay in flight with it (its rank would hold every later batch for good, waiting for it).
    const runReplays = Scope.provide(sequencer.runQueued, yield* Effect.scope)
    // Which ranks' readers are subscribed now; `subscribed` is all of them.
    const ranksUp = new Array<boolean>(dpSize).fill(false)
    const setUp = (rank: number, isUp: boolean) => {
      ranksUp[rank] = isUp
      st.subscribed = ranksUp.every((u) => u)
    }
    // Each rank's stream, once its reader has one (by rank): the engine's end (engineGone) retracts them all.
    const streams: Array<RankStream | undefined> = new Array(dpSize).fill(undefined)
    // retryForever takes an attempt's defect in; one outside it (its bookkeeping) is said, and the loop runs again (a
    // rank's reader: its retry loop only, the rank's stream kept, as across any reconnect)
    const kept = (what: string) => background(what, "KV events no longer reach kvcached", { restart: RESTART })
    const readOneRank = (rank: number) =>
      Effect.gen(function* () {
        const at = rankEndpoint(endpoint, rank)
        const replay = replayEndpoint === undefined ? undefined : rankEndpoint(replayEndpoint, rank)
        if (at === undefined || (replayEndpoint !== undefined && replay === undefined)) {
          fault(
            `rank ${rank}`,
            `kv events: cannot offset ${endpoint} for DP rank ${rank} (only tcp:// and inproc:// can be)`
          )
          return
        }
        // One stream per rank for the life of the bridge, across reader restarts: a new socket continues it, so
        // the batches lost while the reader was down show as a gap (replayed, or a Resync), as after any
        // reconnect. A fresh stream would take the next batch as a join and lose them without a word.
        const r: RankStream = {
          rank,
          endpoint: at,
          replayAt: replay === undefined ? undefined : connectAddress(replay),
          expected: undefined,
          holding: undefined
        }
        streams[rank] = r
        return yield* retryForever({
          capMs: backoffMaxMs,
          attempt: (progressed) =>
            Effect.scoped(
              readRank({
                rank,
                endpoint: at,
                engineBinds,
                topic,
                receiveHighWaterMark: subscriberHighWaterMark(maxQueueBytes),
                maxFrameBytes: maxFrameBytes(maxQueueBytes),
                // Recorded as an undecodable message is (rankSequencer.ts); what it cost shows as the next batch's gap.
                onDropped: (why) => {
                  st.lastBatchError = `DP rank ${rank}: ${why}`
                },
                onSubscribed: () => {
                  setUp(rank, true)
                  fault(`rank ${rank}`, undefined)
                },
                // A new publisher's run whose seq passed the old one's before the reconnect would read as the old
                // run going on (its missed batches "replayed" from the new run): taken as a restart instead, as at
                // an engine exit; the same run after a network blip is then retracted and replayed, nothing lost.
                onReconnected: Effect.suspend(() => {
                  if (r.expected === undefined || r.expected === 0n) return Effect.void
                  sequencer.engineGone(r)
                  // Bound, a frame over the bound drops the publisher's connection and it reconnects: nothing else says
                  // so, and an operator whose kv.max_queue_bytes is too small sees only this line.
                  const frame = `; a cause besides a restart: the agent dropped its connection for a frame over ${maxFrameBytes(maxQueueBytes)} bytes (the frame bound from kv.max_queue_bytes)`
                  return Effect.logInfo(
                    `kv events: a rank's publisher reconnected; its stream is taken to start over (a restart Resync, the new run's missed batches replayed)${engineBinds ? "" : frame}`,
                    { endpoint: at, dpRank: rank }
                  )
                }),
                onFrames: (frames) =>
                  Effect.andThen(
                    progressed,
                    Effect.andThen(
                      Effect.sync(() => sequencer.onMessage(r, frames)),
                      runReplays
                    )
                  )
              })
            ),
          onFailure: (error, failures, retryInMs) =>
            Effect.gen(function* () {
              setUp(rank, false)
              fault(
                `rank ${rank}`,
                `kv events reader of DP rank ${rank} stopped: ${error} (failure ${failures} in a row; resubscribing in ${retryInMs} ms)`
              )
              // Once per outage: later failures of the same outage only grow the backoff.
              if (failures === 1) {
                yield* Effect.logWarning("kv events: the reader stopped; resubscribing", {
                  endpoint: at,
                  dpRank: rank,
                  error
                })
              }
            })
        }).pipe(kept(`the kv events reader of DP rank ${rank}`))
      })
    for (let rank = 0; rank < dpSize; rank++) yield* Effect.forkScoped(readOneRank(rank))

    link = yield* Effect.forkDetach(
      kept("the kvcached link")(
        runLink({
          path: o.uds,
          queue,
          hello: hello(o.identity, { epoch: o.epoch, blockSize: o.blockSize, dpSize }),
          resync: resyncOf,
          materialize: sequencer.materialize,
          backoffMaxMs,
          onConnected: (up, err, retryInMs) => {
            st.kvcachedConnected = up
            const retry = retryInMs === undefined ? "" : ` (reconnecting in ${retryInMs} ms)`
            fault("kvcached", up ? undefined : `kvcached ${o.uds}: ${err}${retry}`)
            progressed?.()
          },
          onStateLost: () => {
            st.kvcachedStateLosses++
          },
          nextSeqOf: (rank) => streams[rank]?.expected,
          onForwarded: (n) => {
            st.forwarded += n
            overflow.acked()
            progressed?.()
          },
          onUnencodable: (error) => {
            st.lastBatchError = error
          }
        })
      )
    )

    return {
      status: Effect.sync(() => ({
        ...st,
        // Batches held while their rank's replay runs (live ones and the replay's replies so far) are waiting for
        // kvcached too, under the same bound (queue.outside).
        queued: queue.batches + sequencer.held.batches,
        queuedBytes: queue.bytes + queue.outside,
        dropped: queue.dropped,
        resyncs: queue.resyncs,
        ranks: ranksUp.map((subscribed, rank) => {
          const r = streams[rank]
          return { rank, subscribed, lastSeq: r?.lastSeq?.toString(), replaying: r?.replay !== undefined }
        })
      })),
      engineGone: Effect.sync(() => {
        for (const r of streams) if (r !== undefined) sequencer.engineGone(r)
      })
    } satisfies LiveBridge
  })

/** The bridge and what its layer tells it: that the engine run ended. */
export interface LiveBridge extends KvBridgeService {
  /** The engine's run ended: a `restart` Resync for each rank that had a stream (rankSequencer engineGone). */
  readonly engineGone: Effect.Effect<void>
}

/** Tells `bridge` each time an engine run ends (Restarting or Stopped after a run), for as long as the scope. */
const followEngine = (bridge: LiveBridge, engine: EngineProcessService): Effect.Effect<void, never, Scope.Scope> =>
  engine.changes.pipe(
    Stream.filter((s) => s._tag === "Restarting" || s._tag === "Stopped"),
    Stream.runForEach(() => bridge.engineGone),
    background("the kv engine follower", "a run's end is no longer retracted from kvcached", { restart: RESTART }),
    Effect.forkScoped,
    Effect.asVoid
  )

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

/**
 * Production: `[kv]` and the engine's plan decide; off unless `[kv].events`, an event source and `[kv].uds`.
 * It follows the engine supervisor: a run that ends is retracted from kvcached at once.
 */
export const layer: Layer.Layer<KvBridge, never, Config | EnginePlan | Metrics | EngineProcess> = Layer.effect(
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
    yield* followEngine(bridge, yield* EngineProcess)
    yield* registerMetrics(yield* Metrics, bridge.status)
    return bridge
  })
)
