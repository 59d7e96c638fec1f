/**
 * The link to cgn-kvcached: an effect RPC client (contract: services/kv/KvcachedRpc.ts) on the Unix socket.
 * Per connection: Hello, whose answer acknowledges what the receiver already applied of this epoch, then
 * Push calls, one at a time, each a chunk taken from the KvQueue; the answer acknowledges records up to
 * `applied` and only then are they forgotten. A chunk that was not acknowledged when the connection broke
 * stays in the queue and is resent first on the next connection (the receiver skips `n` it has applied),
 * so nothing in flight is lost silently: it arrives, or the queue's byte bound drops older unsent records
 * and an overflow Resync says so. One connection per session (the RPC protocol's own retry is off), so
 * reconnects follow our capped, jittered backoff and every one starts with Hello. A chunk the client cannot
 * encode (a record the wire schema refuses) is never resent as it is: it would fail the same way every time and
 * hold back everything after it, so its bad records become decode Resyncs first. Never fails.
 */

import * as path from "node:path"
import * as NodeSocket from "@effect/platform-node/NodeSocket"
import { Deferred, Effect, Exit, Fiber, Layer, Schedule } from "effect"
import { RpcClient, RpcSerialization } from "effect/rpc"
import { type HelloPayload, KvcachedRpcs, type KvRecord } from "../../services/kv/KvcachedRpc.ts"
import type { KvQueue } from "../../services/kv/KvQueue.ts"
import { type Resync, wireError } from "../../services/kv/KvWire.ts"
import type { Prepared, QueuedRecord, SentRecord } from "../../services/kv/QueueRecords.ts"
import { socketDistrust } from "../stateDir/stateFiles.ts"
import type { QueuedBody } from "./rankSequencer.ts"
import { retryForever } from "./retrying.ts"

export interface LinkOptions {
  readonly path: string
  readonly queue: KvQueue<QueuedBody>
  readonly hello: HelloPayload
  /** Renders an overflow (or decode) Resync for the queue; the queue counts it when kvcached acknowledges it. */
  readonly resync: (r: Resync) => QueuedRecord<QueuedBody>
  /** The wire record of a queued body (a raw batch is decoded here, when it is sent; one that fails is dropped). */
  readonly materialize: (body: QueuedBody) => Prepared<QueuedBody>
  readonly backoffMaxMs: number
  /**
   * Connected (kvcached took what was waiting: a Push acknowledged, or nothing to send), or not: why, and in how
   * long the next try is (none while a try is under way).
   */
  readonly onConnected: (connected: boolean, error: string | undefined, retryInMs?: number) => void
  /** Batches kvcached acknowledged. */
  readonly onForwarded: (batches: number) => void
  /**
   * kvcached answered Hello with nothing applied after it had acknowledged `acknowledged` records of this epoch
   * (it lost its state: restarted without it), or with fewer applied than it had acknowledged (`acknowledged` is then
   * the records it lost); those records are not sent again.
   */
  readonly onStateLost?: (acknowledged: number) => void
  /** The seq rank `dpRank`'s engine stream goes on with (the reader's next), for a Resync when the queue holds none. */
  readonly nextSeqOf?: (dpRank: number) => bigint | undefined
  /** A record the client could not encode was replaced by a decode Resync (or, itself a Resync, removed): why. */
  readonly onUnencodable?: (error: string) => void
  /** Records per Push (default 512) and their bytes (default 1 MiB or a quarter of the bound; at least one record). */
  readonly chunkRecords?: number
  readonly chunkBytes?: number
  /** A connection with no frame from kvcached for this long is dropped (default 5 s; RPC pings keep it busy). */
  readonly pingIntervalMs?: number
  /**
   * How long Hello or one Push may go unanswered before the session is dropped and retried (default 30 s). The
   * pings only show that the connection is up: a kvcached that answers them but is stuck applying a chunk would
   * otherwise hold the link, and with it every event after that chunk, for good.
   */
  readonly callTimeoutMs?: number
}

export const DEFAULT_CALL_TIMEOUT_MS = 30_000

/** The longest line read from kvcached (characters); its answers are far shorter. */
export const MAX_ANSWER_LINE_CHARS = 64 * 1024

/** Taken records are prepared (`materialize`) when taken, so what is sent is always a wire record. */
const toWire = (s: SentRecord<QueuedBody>): KvRecord => ({ ...s.record, n: s.n }) as KvRecord

/**
 * After a failed Push: if the client could not encode the chunk (so none of it was delivered), each record it
 * refuses becomes a decode Resync of its range, or is removed when even that cannot be encoded, and the chunk is
 * numbered again (queue.rewriteUnacked). Returns why, or undefined when the chunk encodes (the failure was
 * elsewhere). Rendering is validated here too: what materialize let through must still never wedge the link.
 */
const repairUnencodable = (o: LinkOptions): string | undefined => {
  const reasons: Array<string> = []
  o.queue.rewriteUnacked((s) => {
    const why = wireError(toWire(s))
    if (why === undefined) return s
    reasons.push(`DP rank ${s.dpRank} seq ${s.fromSeq}: ${why}`)
    if (!s.batch) return undefined
    const r = o.resync({ reason: "decode", dpRank: s.dpRank, fromSeq: s.fromSeq, toSeq: s.nextSeq }).record
    const resync = { ...s, record: r, batch: false }
    return wireError(toWire(resync)) === undefined ? resync : undefined
  })
  if (reasons.length === 0) return undefined
  const error = `kvcached's client refused to encode ${reasons.length} record(s), not resent: ${reasons.join("; ")}`
  o.onUnencodable?.(error)
  return error
}

/**
 * kvcached came back having applied only up to `applied`, below the `acknowledged` records it had confirmed (a
 * journal that lost its tail): the records after `applied` are gone for it, removals among them, so what it holds of
 * this node may name blocks the engine evicted. They cannot be sent again (forgotten once acknowledged): a `gap`
 * Resync per rank, from seq 0 to the seq the stream goes on with, tells it to drop the node's blocks, ahead of the
 * records resent, all numbered on from `applied + 1` (no hole in `n`); counted and logged as a state loss.
 */
const partlyLost = (o: LinkOptions, applied: number, acknowledged: number) => {
  const lost = acknowledged - 1 - applied
  o.onStateLost?.(lost)
  const resyncs = Array.from({ length: Math.max(1, o.hello.dp_size) }, (_, rank) =>
    o.resync({ reason: "gap", dpRank: rank, fromSeq: 0n, toSeq: o.queue.nextSeqOf(rank) ?? o.nextSeqOf?.(rank) ?? 0n })
  )
  o.queue.rewriteUnacked((s) => s, applied + 1, resyncs)
  return Effect.logWarning(
    `kvcached answered Hello with records applied up to ${applied} after it had acknowledged up to ${acknowledged - 1}: it lost ${lost} record(s) of this node's KV events (not sent again); a gap Resync per DP rank tells it to drop this node's blocks`
  ).pipe(Effect.annotateLogs({ uds: o.path, epoch: o.hello.epoch }))
}

/** Waits for a queue push, or fails when the connection drops meanwhile (so a dead peer is noticed early). */
const awaitWork = (queue: KvQueue<QueuedBody>, disconnected: Deferred.Deferred<void>) =>
  Effect.raceFirst(
    Effect.callback<void>((resume) => {
      queue.onPush(() => resume(Effect.void))
      return Effect.sync(() => queue.cancelWake())
    }),
    Effect.flatMap(Deferred.await(disconnected), () => Effect.fail(new Error("kvcached closed the connection")))
  )

/**
 * One connection: Hello, then Push until something breaks. Fails with why it ended. `progressed` runs each
 * time kvcached acknowledges a whole Push, or has nothing left to take: only that, not an answered Hello, shows
 * the peer really works. `onUp` runs the first time it does: a kvcached that answers Hello and the pings but
 * never a Push (stuck applying) is not shown as connected while the queue fills and drops behind it.
 */
const session = (o: LinkOptions, onUp: Effect.Effect<void>, progressed: Effect.Effect<void>) =>
  Effect.gen(function* () {
    // Whoever listens there gets the node's KV events: only a socket of the agent's user or root, in a directory
    // others cannot take it over in (stateFiles.ts). Refused like a failed connect: retried with the backoff, as the
    // real kvcached may bind it later.
    // The path as judged is the path connected to: a `..` after a link, resolved by the kernel through the link, could
    // reach a socket the check never saw (a review), so both take it as path.resolve does.
    const sock = path.resolve(o.path)
    const distrust = yield* Effect.promise(() => socketDistrust(sock))
    if (distrust !== undefined) return yield* Effect.fail(new Error(`kv.uds ${distrust}: not connecting`))
    const disconnected = yield* Deferred.make<void>()
    const protocol = RpcClient.layerProtocolSocket({
      retryTransientErrors: false,
      retryPolicy: Schedule.recurs(0),
      pingInterval: o.pingIntervalMs ?? 5_000
    }).pipe(
      Layer.provide(NodeSocket.layerNet({ path: sock })),
      // kvcached's answers are a few dozen bytes ({"applied": n}): a line past 64 KiB is no answer, and effect's
      // default (16 MiB) let a peer that never ends its line cost ~1 s of CPU and hundreds of MB per connection.
      Layer.provide(RpcSerialization.layerNdjsonWith({ maxBufferSize: MAX_ANSWER_LINE_CHARS })),
      Layer.provide(
        Layer.succeed(RpcClient.ConnectionHooks, {
          // The last failure and its "reconnecting in N ms" are over once the socket is up; Hello may take up to
          // callTimeoutMs to be answered (or not), and the status says that meanwhile.
          onConnect: Effect.sync(() => o.onConnected(false, "connected; Hello not answered yet")),
          onDisconnect: Deferred.succeed(disconnected, undefined)
        })
      )
    )
    // Built in this session's scope: the socket lives exactly as long as the session.
    const client = yield* RpcClient.make(KvcachedRpcs).pipe(Effect.provideContext(yield* Layer.build(protocol)))
    const callTimeoutMs = o.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS
    const answered = <A, E>(call: string, effect: Effect.Effect<A, E>) =>
      Effect.timeoutOrElse(effect, {
        duration: callTimeoutMs,
        orElse: () => Effect.fail(new Error(`kvcached did not answer ${call} within ${callTimeoutMs} ms`))
      })
    const welcome = yield* answered("Hello", client.Hello(o.hello))
    // records 0 .. acknowledged - 1 were acknowledged (and forgotten) on earlier connections of this epoch
    const acknowledged = o.queue.unacked[0]?.n ?? o.queue.numbered
    if (welcome.applied === null) {
      if (acknowledged > 0) {
        o.onStateLost?.(acknowledged)
        yield* Effect.logWarning(
          `kvcached answered Hello with nothing applied after it had acknowledged ${acknowledged} record(s) of this epoch: it lost this node's KV events until then (not sent again; its routing lacks those blocks until the engine stores them anew)`
        ).pipe(Effect.annotateLogs({ uds: o.path, epoch: o.hello.epoch }))
      }
    } else if (welcome.applied < acknowledged - 1) yield* partlyLost(o, welcome.applied, acknowledged)
    else o.onForwarded(o.queue.ack(welcome.applied))
    o.onConnected(false, "connected; Hello answered, no Push acknowledged yet")
    let up = false
    const working = Effect.suspend(() => {
      if (up) return progressed
      up = true
      return Effect.andThen(progressed, onUp)
    })
    const { queue } = o
    // A chunk in flight is held until acknowledged: keep it a small part of the bound, so that what arrives
    // meanwhile still has room.
    const chunkBytes = o.chunkBytes ?? Math.min(1024 * 1024, Math.max(1, Math.floor(queue.maxBytes / 4)))
    for (;;) {
      let chunk = queue.unacked
      if (chunk.length === 0) {
        if (queue.size === 0) {
          yield* working
          yield* awaitWork(queue, disconnected)
        }
        chunk = queue.take(o.chunkRecords ?? 512, chunkBytes, o.resync, o.materialize)
        if (chunk.length === 0) continue
      }
      const last = (chunk[chunk.length - 1] as SentRecord<QueuedBody>).n
      const pushed = yield* Effect.exit(
        answered("Push", client.Push({ node_id: o.hello.node_id, epoch: o.hello.epoch, records: chunk.map(toWire) }))
      )
      if (Exit.isFailure(pushed)) {
        const repaired = repairUnencodable(o)
        if (repaired === undefined) return yield* Effect.failCause(pushed.cause)
        // Nothing was sent and the connection is fine: send the repaired chunk on it.
        yield* Effect.logWarning("kv events: records kvcached's client cannot encode were dropped", { error: repaired })
        continue
      }
      const r = pushed.value
      if (r.applied !== null) o.onForwarded(queue.ack(r.applied))
      // A receiver that applies less than it was sent has lost the thread: start over with Hello.
      if (r.applied === null || r.applied < last) {
        return yield* Effect.fail(new Error(`kvcached acknowledged up to ${r.applied} of ${last}`))
      }
      yield* working
    }
  }).pipe(Effect.scoped)

/** Runs until interrupted. */
export const runLink = (o: LinkOptions): Effect.Effect<never> =>
  Effect.gen(function* () {
    let connected: boolean | undefined
    const setState = (up: boolean, error: string | undefined, retryInMs?: number) =>
      Effect.gen(function* () {
        o.onConnected(up, error, retryInMs)
        if (connected === up) return
        connected = up
        if (up) yield* Effect.logInfo("kvcached connected", { uds: o.path })
        else yield* Effect.logWarning("kvcached unavailable; queueing KV events", { uds: o.path, error })
      })
    // A kvcached that answers Hello and then fails each Push (or drops the connection) made no progress: its
    // backoff keeps growing, where resetting it at Hello reconnected at the base delay forever.
    return yield* retryForever({
      capMs: o.backoffMaxMs,
      // The session says itself when kvcached took what was waiting; one held open by a stuck kvcached for the
      // whole Push timeout made no progress, and reconnecting to it at the base delay would loop every 30 s.
      longAttemptIsProgress: false,
      attempt: (progressed) => session(o, setState(true, undefined), progressed),
      onFailure: (error, _failures, retryInMs) => setState(false, error, retryInMs)
    })
  })

/**
 * The most the link's end takes as the bridge stops: programs/shutdownBound.ts's "kvcached told of the last call's
 * end" (README: "+ 1 s when KV events go to kvcached"), shared by the wait for acknowledgements and the interruption.
 */
export const STOP_BOUND_MS = 1_000

/** Of it, the longest wait for kvcached to acknowledge what waits for it (stopLink); the rest is the interruption's. */
export const STOP_ACK_WAIT_MS = 500

/**
 * What kvcached never acknowledged as the bridge stops: batches, and Resyncs (a `restart` one queued as the engine
 * stopped among them: kvcached then keeps this node's blocks of an engine that is gone, which is why it is said).
 */
export const heldAtStop = (queue: KvQueue<unknown>): { batches: number; resyncs: number } | undefined => {
  const resyncs = queue.size + queue.unacked.length - queue.batches + queue.lostRanges
  return queue.batches === 0 && resyncs === 0 ? undefined : { batches: queue.batches, resyncs }
}

export interface StopOptions {
  readonly uds: string
  readonly queue: KvQueue<unknown>
  /** Whether kvcached is connected (took what was waiting on this connection: the bridge's `kvcachedConnected`). */
  readonly connected: () => boolean
  /** Given the function to call at each acknowledgement and connection change while the stop waits (else undefined). */
  readonly onProgress: (wake: (() => void) | undefined) => void
}

/**
 * Ends the link (`link`, runLink's fiber) as the bridge stops, and says what kvcached never acknowledged. The engine's
 * stop has just queued a `restart` Resync per rank: while kvcached is connected and records wait for it, the link
 * runs on until they are acknowledged, the connection goes, or STOP_ACK_WAIT_MS pass (interrupted at once, it
 * dropped a Resync kvcached was applying, and said so, at every clean stop). Then it is interrupted, its end awaited
 * for the rest of STOP_BOUND_MS: a Push in flight is cancelled with a message that a kvcached that stopped reading
 * holds up to 1 s (effect/src/rpc/RpcClient.ts, `sendInterrupt`); past the bound it ends in the background.
 */
export const stopLink = (link: Fiber.Fiber<unknown>, o: StopOptions): Effect.Effect<void> => {
  const settled = () => heldAtStop(o.queue) === undefined || !o.connected()
  const acked = Effect.callback<void>((resume) => {
    const check = () => void (settled() && resume(Effect.void))
    o.onProgress(check)
    check()
  }).pipe(Effect.ensuring(Effect.sync(() => o.onProgress(undefined))))
  return Effect.andThen(Effect.timeoutOption(acked, STOP_ACK_WAIT_MS), Fiber.interrupt(link)).pipe(
    Effect.timeoutOption(STOP_BOUND_MS),
    Effect.andThen(
      Effect.suspend(() => {
        const held = heldAtStop(o.queue)
        if (held === undefined) return Effect.void
        return Effect.logWarning("kv events: stopping with records kvcached never acknowledged; they are dropped", {
          uds: o.uds,
          ...held,
          bytes: o.queue.bytes,
          kvcachedConnected: o.connected()
        })
      })
    )
  )
}
