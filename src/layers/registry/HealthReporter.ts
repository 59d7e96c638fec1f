/**
 * Live HealthReporter: one fiber that grants a lease, creates `${prefix}/${cluster}/nodes/${node_id}` if
 * absent, keeps the lease alive and rewrites the NodeHealth JSON every heartbeat; recovers from etcd
 * outages (backoff with jitter, capped at one heartbeat) and from lost leases (new lease, new epoch);
 * refuses a node id held by another live lease. On release it writes state=draining, then revokes the
 * lease as the very last step so the key disappears at once. Nothing it does can stop the agent.
 */
import { Clock, Duration, Effect, Fiber, Layer, Random, Semaphore, Stream } from "effect"
import { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import { Config } from "../../services/config/Config.ts"
import { type NodeState, NodeStatus } from "../../services/node/NodeStatus.ts"
import { type DampingState, initialDamping, isFact, observe } from "../../services/registry/HealthDamping.ts"
import {
  type ConflictHolder,
  EtcdUnavailable,
  epochOf,
  HealthReporter,
  type HealthReporterService,
  nodeKey,
  RegistrationConflict,
  type RegistrationState,
  type RegistrationStatus,
  type ReporterError,
  standaloneStatus
} from "../../services/registry/HealthReporter.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { type EtcdOps, type Holder, makeEtcdOps, type WriteOutcome } from "./etcdClient.ts"

/** Timing derived from [agent]; exported for tests and docs. */
export const reporterTiming = (heartbeat: Duration.Duration, leaseTtl: Duration.Duration) => {
  const heartbeatMs = Duration.toMillis(heartbeat)
  // etcd leases have whole-second TTLs, at least 1 s.
  const ttlSeconds = Math.max(1, Math.ceil(Duration.toMillis(leaseTtl) / 1000))
  // Keepalive at least three times per TTL (what the Go client does), writes once per heartbeat.
  const tickMs = Math.max(50, Math.min(heartbeatMs, Math.floor((ttlSeconds * 1000) / 3)))
  // A call may take up to a heartbeat (at least 1 s on a busy host), never more than half the TTL.
  const callTimeoutMs = Math.max(200, Math.min(Math.max(heartbeatMs, 1000), 5000, (ttlSeconds * 1000) / 2))
  return { heartbeatMs, ttlSeconds, tickMs, callTimeoutMs }
}

/** Retry delay after `failures` consecutive failures, capped at one heartbeat (the shared jittered backoff). */
export const backoffMs = (failures: number, heartbeatMs: number, random: number): number =>
  jitteredBackoffMs(failures, heartbeatMs, random)

interface Session {
  readonly id: string
  readonly epoch: string
  readonly ttlMs: number
  readonly grantedAt: number
  lastKeepAliveAt: number
  registered: boolean
}

/** The reporter's mutable state; only touched under the write lock (or read whole by `status`). */
interface Internal {
  state: RegistrationState
  session: Session | undefined
  sequence: number
  lastWriteMs: number | undefined
  lastRecord: NodeHealth | undefined
  damping: DampingState
  forcedDraining: boolean
  stopping: boolean
  lastError: string | undefined
  conflict: ConflictHolder | undefined
  failuresInRow: number
  writes: number
  writeFailures: number
  leasesGranted: number
  leasesLost: number
}

const holderOf = (h: Holder): ConflictHolder => {
  let advertiseAddr = ""
  let epoch = ""
  try {
    const parsed = NodeHealth.fromJSON(JSON.parse(h.value))
    advertiseAddr = parsed.advertiseAddr
    epoch = parsed.freshness?.epoch ?? ""
  } catch {
    // not a NodeHealth record: keep the lease only
  }
  return { lease: h.lease === "0" ? "none" : epochOf(h.lease), advertiseAddr, epoch }
}

const standalone = (nodeId: string): Effect.Effect<HealthReporterService> =>
  Effect.gen(function* () {
    yield* Effect.logInfo(
      `standalone: [cluster].etcd is empty, so node "${nodeId}" is not registered in etcd and no router will discover it`
    )
    return {
      status: Effect.succeed(standaloneStatus),
      lastRecord: Effect.succeed(undefined),
      markDraining: Effect.void,
      flush: Effect.void
    }
  })

type StepReason = "tick" | "flush" | "drain" | "shutdown" | "change"

const make = Effect.gen(function* () {
  const config = yield* Config
  const nodeStatus = yield* NodeStatus
  const { cluster, agent } = config
  if (cluster.etcd.length === 0) return yield* standalone(agent.node_id)

  const timing = reporterTiming(agent.heartbeat, agent.lease_ttl)
  const key = nodeKey(cluster.etcd_prefix, cluster.name, agent.node_id)
  const ops: EtcdOps = yield* makeEtcdOps(cluster, {
    callTimeoutMs: timing.callTimeoutMs,
    reconnectCapMs: timing.heartbeatMs
  })
  const lock = yield* Semaphore.make(1)
  const s: Internal = {
    state: "registering",
    session: undefined,
    sequence: 0,
    lastWriteMs: undefined,
    lastRecord: undefined,
    damping: initialDamping,
    forcedDraining: false,
    stopping: false,
    lastError: undefined,
    conflict: undefined,
    failuresInRow: 0,
    writes: 0,
    writeFailures: 0,
    leasesGranted: 0,
    leasesLost: 0
  }

  const setState = (next: RegistrationState) =>
    Effect.gen(function* () {
      const prev = s.state
      s.state = next
      if (prev === next) return
      const fields = { key, from: prev, to: next, epoch: s.session?.epoch ?? "", error: s.lastError ?? "" }
      if (next === "registered")
        yield* Effect.logInfo("etcd registration: registered").pipe(Effect.annotateLogs(fields))
      else yield* Effect.logWarning(`etcd registration: ${next}`).pipe(Effect.annotateLogs(fields))
    })

  const grant = Effect.gen(function* () {
    const g = yield* ops.grant(timing.ttlSeconds)
    const now = yield* Clock.currentTimeMillis
    const session: Session = {
      id: g.id,
      epoch: epochOf(g.id),
      ttlMs: g.ttlMs,
      grantedAt: now,
      lastKeepAliveAt: now,
      registered: false
    }
    s.session = session
    s.leasesGranted++
    yield* Effect.logInfo("etcd lease granted").pipe(
      Effect.annotateLogs({ key, epoch: session.epoch, ttl_ms: session.ttlMs })
    )
    return session
  })

  /** The record to write now: the live snapshot, the damped state, and fresh freshness. */
  const buildRecord = (session: Session, reason: StepReason, now: number) =>
    Effect.gen(function* () {
      const snapshot = yield* nodeStatus.snapshot
      const draining = s.forcedDraining || reason === "shutdown" || (yield* nodeStatus.draining)
      const observed: NodeState = draining ? "draining" : (snapshot.state as NodeState)
      // Heartbeats count as observations; a fact (engine exit, engine ready, draining) is published by any
      // write at once, while a probe verdict waits for health_damping heartbeats.
      const fact = isFact(observed, snapshot.engine?.phase ?? "", s.damping.published)
      if (reason === "tick" || fact) {
        s.damping = observe(s.damping, observed, agent.health_damping, reason === "shutdown" || fact)
      }
      const state = s.damping.published ?? observed
      s.sequence++
      return NodeHealth.fromPartial({
        ...snapshot,
        state,
        freshness: { epoch: session.epoch, sequence: s.sequence, writtenAt: new Date(now).toISOString() }
      })
    })

  const conflictError = (holder: Holder) =>
    Effect.gen(function* () {
      const h = holderOf(holder)
      const error = new RegistrationConflict({
        key,
        nodeId: agent.node_id,
        holderLease: h.lease,
        holderAdvertiseAddr: h.advertiseAddr
      })
      const changed = s.conflict?.lease !== h.lease
      s.conflict = h
      s.lastError = error.message
      if (changed) yield* Effect.logError(error.message)
      yield* setState("conflict")
      return yield* Effect.fail(error)
    })

  /** One round: lease (grant or keepalive), then a write when one is due. Runs under the lock. */
  const step = (reason: StepReason): Effect.Effect<void, ReporterError> =>
    Effect.gen(function* () {
      let session = s.session
      if (session === undefined) {
        // "revoked" and "retrying" stay visible until the registration succeeds
        if (s.state !== "revoked" && s.state !== "retrying") yield* setState("registering")
        session = yield* grant
      } else if (reason === "tick") {
        yield* ops.keepAlive(session.id)
        session.lastKeepAliveAt = yield* Clock.currentTimeMillis
        yield* Effect.logTrace("etcd keepalive", { key, lease: session.id })
      }
      const now = yield* Clock.currentTimeMillis
      const due =
        !session.registered ||
        reason !== "tick" ||
        s.lastWriteMs === undefined ||
        now - s.lastWriteMs >= timing.heartbeatMs - timing.tickMs / 2
      if (!due) return
      const record = yield* buildRecord(session, reason, now)
      const value = JSON.stringify(NodeHealth.toJSON(record))
      let outcome: WriteOutcome = session.registered
        ? yield* ops.write(key, value, session.id)
        : yield* ops.create(key, value, session.id)
      if (outcome._tag === "Missing") {
        // The key vanished under a live lease (deleted by hand): create it again.
        session.registered = false
        outcome = yield* ops.create(key, value, session.id)
      }
      if (outcome._tag === "Held") {
        session.registered = false
        return yield* conflictError(outcome.holder)
      }
      if (outcome._tag === "Missing") {
        return yield* Effect.fail(new EtcdUnavailable({ operation: "create", reason: "key vanished during create" }))
      }
      yield* Effect.logDebug("etcd write", {
        key,
        reason,
        state: record.state,
        sequence: record.freshness?.sequence,
        lease: session.id
      })
      session.registered = true
      s.lastWriteMs = now
      s.lastRecord = record
      s.writes++
      s.failuresInRow = 0
      s.lastError = undefined
      s.conflict = undefined
      yield* setState("registered")
    }).pipe(
      Effect.tapError((e) =>
        Effect.sync(() => {
          s.writeFailures++
          s.lastError = e.message
        })
      )
    )

  /** Runs a step under the lock and updates the state for its failure; returns the delay before the next one. */
  const round = (reason: StepReason) =>
    lock.withPermits(1)(
      step(reason).pipe(
        Effect.as(timing.tickMs),
        Effect.catch((e: ReporterError) =>
          Effect.gen(function* () {
            if (e._tag === "LeaseLost") {
              s.session = undefined
              s.leasesLost++
              s.failuresInRow = 0
              yield* setState("revoked")
              return 0
            }
            if (e._tag === "RegistrationConflict") {
              const r = yield* Random.next
              return Math.round(timing.heartbeatMs * (0.5 + r / 2))
            }
            s.failuresInRow++
            yield* setState("retrying")
            return backoffMs(s.failuresInRow, timing.heartbeatMs, yield* Random.next)
          })
        )
      )
    )

  const loop = Effect.gen(function* () {
    while (!s.stopping) {
      const started = yield* Clock.currentTimeMillis
      const delay = yield* round("tick")
      const elapsed = (yield* Clock.currentTimeMillis) - started
      yield* Effect.sleep(Duration.millis(Math.max(0, delay === timing.tickMs ? delay - elapsed : delay)))
    }
  })

  /** A write outside the heartbeat (flush, drain), reporting its failure to the caller. */
  const writeNow = (reason: StepReason): Effect.Effect<void, ReporterError> =>
    lock.withPermits(1)(
      step(reason).pipe(
        Effect.catchTag("LeaseLost", (e) =>
          Effect.gen(function* () {
            s.session = undefined
            s.leasesLost++
            yield* setState("revoked")
            return yield* Effect.fail(e)
          })
        )
      )
    )

  const shutdown = Effect.gen(function* () {
    s.stopping = true
    const session = s.session
    if (session === undefined) return
    if (session.registered && s.lastRecord?.state !== "draining") {
      yield* step("shutdown").pipe(
        Effect.catch((e) => Effect.logWarning(`etcd: could not write state=draining before revoking: ${e.message}`))
      )
    }
    // Last step: the key goes with the lease, at once.
    yield* ops.revoke(session.id).pipe(
      Effect.tap(() => Effect.logInfo("etcd lease revoked, node key removed").pipe(Effect.annotateLogs({ key }))),
      Effect.catch((e) => Effect.logWarning(`etcd: lease revoke failed, the key expires after its TTL: ${e.message}`))
    )
    s.session = undefined
  })

  const loopFiber = yield* loop.pipe(Effect.annotateLogs({ component: "HealthReporter" }), Effect.forkScoped)
  // A state change goes out at once, not at the next heartbeat: draining, an engine exit or an engine becoming
  // ready is written as it happens; a probe verdict is written too but stays damped (buildRecord).
  const drainFiber = yield* nodeStatus.changes.pipe(
    Stream.runForEach((st) => writeNow(st === "draining" ? "drain" : "change").pipe(Effect.ignore)),
    Effect.forkScoped
  )
  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      yield* Fiber.interrupt(drainFiber)
      yield* Fiber.interrupt(loopFiber)
      yield* lock.withPermits(1)(shutdown)
    }).pipe(Effect.annotateLogs({ component: "HealthReporter" }))
  )

  const status = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const session = s.session
    const result: RegistrationStatus = {
      state: s.state,
      key,
      leaseId: session?.id,
      epoch: session?.epoch,
      leaseTtlMs: session?.ttlMs,
      leaseAgeMs: session === undefined ? undefined : now - session.grantedAt,
      sinceKeepAliveMs: session === undefined ? undefined : now - session.lastKeepAliveAt,
      sequence: s.lastRecord?.freshness?.sequence ?? 0,
      lastWriteAt: s.lastRecord?.freshness?.writtenAt,
      publishedState: s.lastRecord?.state,
      lastError: s.lastError,
      conflict: s.conflict,
      writes: s.writes,
      writeFailures: s.writeFailures,
      leasesGranted: s.leasesGranted,
      leasesLost: s.leasesLost
    }
    return result
  })

  const service: HealthReporterService = {
    status,
    lastRecord: Effect.sync(() => s.lastRecord),
    markDraining: Effect.suspend(() => {
      s.forcedDraining = true
      return writeNow("drain")
    }),
    flush: writeNow("flush")
  }
  return service
})

/** The live layer; fails only when a TLS file named in [cluster] cannot be read. */
export const layer = Layer.effect(HealthReporter, make)
