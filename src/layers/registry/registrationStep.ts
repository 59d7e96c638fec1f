/**
 * One round of the HealthReporter against etcd: grant a lease when there is none (or keep the current
 * one alive on a tick), then, when a write is due, build the NodeHealth record (live snapshot and state, fresh
 * freshness) and create or rewrite the node key under the lease. A key held by another
 * live lease is a RegistrationConflict; a key deleted by hand is created again. Callers hold the
 * reporter's write lock.
 */
import { Clock, Duration, Effect, Exit } from "effect"
import { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import type { AgentConfig } from "../../services/config/Config.ts"
import type { NodeState, NodeStatusService } from "../../services/node/NodeStatus.ts"
import {
  type ConflictHolder,
  EtcdUnavailable,
  epochOf,
  RegistrationConflict,
  type RegistrationState,
  type ReporterError
} from "../../services/registry/HealthReporter.ts"
import type { ReporterTiming } from "../../services/registry/ReporterTiming.ts"
import type { EtcdOps, Holder, WriteOutcome } from "./etcdClient.ts"
import type { LeaseRecord } from "./leaseRecord.ts"
import type { ReporterState, Session } from "./reporterState.ts"

export type StepReason = "tick" | "flush" | "drain" | "shutdown" | "change"

/** Who holds the key, from its lease and (when it is a NodeHealth record) its value. */
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

export interface StepContext {
  readonly s: ReporterState
  readonly ops: EtcdOps
  readonly key: string
  readonly timing: ReporterTiming
  readonly agent: AgentConfig["agent"]
  readonly nodeStatus: NodeStatusService
  /** The lease record in agent.state_dir (leaseRecord.ts); none: no lease is recorded nor revoked as a predecessor's. */
  readonly leaseRecord?: LeaseRecord | undefined
}

export interface RegistrationStep {
  /** One round: lease (grant or keepalive), then a write when one is due. */
  readonly step: (reason: StepReason) => Effect.Effect<void, ReporterError>
  /** Moves to a state, logging the change. */
  readonly setState: (next: RegistrationState) => Effect.Effect<void>
}

export const makeRegistrationStep = ({
  s,
  ops,
  key,
  timing,
  agent,
  nodeStatus,
  leaseRecord
}: StepContext): RegistrationStep => {
  const setState = (next: RegistrationState) =>
    Effect.gen(function* () {
      const prev = s.state
      s.state = next
      if (prev === next) return
      // a field without a value is left out, not logged empty
      const epoch = s.session?.epoch
      const error = s.lastError
      const fields = {
        key,
        from: prev,
        to: next,
        ...(epoch === undefined ? {} : { epoch }),
        ...(error === undefined || error === "" ? {} : { error })
      }
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
    // Before the key is created under it: a key under a lease the record does not name is never revoked by the next agent.
    if (leaseRecord !== undefined) yield* leaseRecord.write(g.id)
    return session
  })

  /**
   * The record to write now: the live snapshot and state, and fresh freshness. The state is written as it is, with no
   * flap damping: each is a fact, written by the write its change makes (HealthReporter.ts). An engine Unhealthy is
   * always a run's teardown (the supervisor ends the run on a liveness loss, a startup timeout, an exit or a restart
   * asked for: layers/engine/watch.ts, runOnce.ts), Restarting next; every other unhealthy is a fact too (a stall,
   * failing calls, a GPU fault or wait, a crash loop). Damping the liveness one (agent.health_damping, now without
   * effect) kept the record saying `ready` while the engine was torn down and every call refused (a chaos soak).
   */
  const buildRecord = (session: Session, reason: StepReason, now: number) =>
    Effect.gen(function* () {
      const snapshot = yield* nodeStatus.snapshot
      const draining = s.forcedDraining || reason === "shutdown" || (yield* nodeStatus.draining)
      const state: NodeState = draining ? "draining" : (snapshot.state as NodeState)
      s.sequence++
      return NodeHealth.fromPartial({
        ...snapshot,
        state,
        freshness: {
          epoch: session.epoch,
          sequence: s.sequence,
          writtenAt: new Date(now).toISOString(),
          heartbeatMs: Duration.toMillis(agent.heartbeat)
        }
      })
    })

  const conflictError = (holder: Holder, notRevoked: string | undefined) =>
    Effect.gen(function* () {
      const h = holderOf(holder)
      const ownAddress = (yield* nodeStatus.snapshot).advertiseAddr
      const error = new RegistrationConflict({
        key,
        nodeId: agent.node_id,
        holderLease: h.lease,
        holderAdvertiseAddr: h.advertiseAddr,
        holderIsThisAddress: h.advertiseAddr !== "" && h.advertiseAddr === ownAddress,
        notRevoked
      })
      const changed = s.conflict?.lease !== h.lease
      s.conflict = h
      s.lastError = error.message
      // This node's own previous run holds it after a crash: it ends by itself within the TTL, no operator error.
      if (changed) yield* error.holderIsThisAddress ? Effect.logWarning(error.message) : Effect.logError(error.message)
      yield* setState("conflict")
      return yield* Effect.fail(error)
    })

  /**
   * etcd answered a record that says another state than the node's key does with a refusal: the key must not be
   * kept alive saying what is no longer true. An etcd over its space quota (the NOSPACE alarm) answers keepalives and
   * refuses every write, so each tick's keepalive would hold a stale "ready" up for as long as the alarm lasts,
   * through a cordon, a drain or an engine exit. The lease is revoked, the key with it; where etcd does not answer
   * that, the lease is no longer kept alive and the key expires within its TTL. The next round grants a new lease
   * (refused too while etcd is over its quota) and writes the record then. An etcd that answers nothing keeps no
   * lease alive either: that is left to the TTL and to the shutdown's own revoke, at no extra call deadline. A
   * refused heartbeat that changes no state keeps the key: a stale `writtenAt` says what it is, and on a full etcd
   * every node's writes fail alike.
   */
  const withdraw = (session: Session, record: NodeHealth, refused: EtcdUnavailable) =>
    Effect.gen(function* () {
      const published = s.lastRecord?.state
      if (refused.answered !== true || !session.registered || published === undefined || published === record.state)
        return yield* Effect.fail(refused)
      s.session = undefined
      // Not "registered" until the next round registers again (a state change's own write has no round after it).
      s.lastError = refused.message
      yield* setState("retrying")
      const revoked = yield* Effect.exit(ops.revoke(session.id))
      yield* Effect.logWarning(
        Exit.isSuccess(revoked)
          ? `etcd refused the node's record (state ${record.state}): lease revoked, so the key no longer says ${published}`
          : `etcd refused the node's record (state ${record.state}) and its lease's revoke: the lease is no longer kept alive, so the key saying ${published} expires within its TTL`
      ).pipe(Effect.annotateLogs({ key, epoch: session.epoch, error: refused.message }))
      return yield* Effect.fail(refused)
    })

  /**
   * The key is held by the lease this node's previous agent recorded in state_dir (leaseRecord.ts): that agent died
   * without revoking it, since only one agent at a time holds state_dir. Its lease is revoked (the key goes with it)
   * and the key created at once, rather than left saying what the dead agent last wrote until the lease ends. A
   * revoke that fails leaves the conflict as it is (saying why), for the next round to try again.
   */
  const takeFromPrevious = (previous: string, held: WriteOutcome, session: Session, value: string) =>
    ops.revoke(previous).pipe(
      Effect.matchEffect({
        onFailure: (e) =>
          Effect.succeed({
            outcome: held,
            notRevoked: `this is that lease, but its revoke failed (${e.message})`
          }),
        onSuccess: () =>
          Effect.logWarning(
            `etcd: the node's key was held by lease ${epochOf(previous)}, this node's previous agent's (recorded in agent.state_dir), stopped without revoking it: lease revoked, registering now`
          ).pipe(
            Effect.annotateLogs({ key, epoch: session.epoch }),
            Effect.andThen(ops.create(key, value, session.id)),
            Effect.map((outcome) => ({ outcome, notRevoked: undefined }))
          )
      })
    )

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
        yield* Effect.logTrace("etcd keepalive", { key, epoch: session.epoch })
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
      const current = session
      let outcome: WriteOutcome = yield* Effect.catchTag(
        session.registered ? ops.write(key, value, session.id) : ops.create(key, value, session.id),
        "EtcdUnavailable",
        (e) => withdraw(current, record, e)
      )
      if (outcome._tag === "Missing") {
        // The key went with its lease when that expired (etcd paused past the TTL) or was revoked from outside,
        // which can land between a tick's keepalive and its write: ask the lease again, whatever the write's
        // reason; its loss takes the lease-lost path, not the words below. One more round trip, on this rare path.
        yield* ops.keepAlive(session.id)
        // The key vanished under a live lease (deleted by hand): create it again, and say so: an operator who deleted
        // it to take the node out of discovery sees why it is back.
        yield* Effect.logWarning(
          "etcd: the node's key was deleted outside the agent while its lease lives; created again (to take a node out of traffic, POST /cordon)"
        ).pipe(Effect.annotateLogs({ key, epoch: session.epoch }))
        session.registered = false
        outcome = yield* ops.create(key, value, session.id)
      }
      let notRevoked = leaseRecord?.notRevoked
      const previous = leaseRecord?.previous
      if (outcome._tag === "Held" && previous !== undefined && outcome.holder.lease === previous) {
        const taken = yield* takeFromPrevious(previous, outcome, current, value)
        outcome = taken.outcome
        notRevoked = taken.notRevoked ?? notRevoked
      }
      if (outcome._tag === "Held") {
        session.registered = false
        return yield* conflictError(outcome.holder, notRevoked)
      }
      if (outcome._tag === "Missing") {
        return yield* Effect.fail(new EtcdUnavailable({ operation: "create", reason: "key vanished during create" }))
      }
      yield* Effect.logDebug("etcd write", {
        key,
        reason,
        state: record.state,
        sequence: record.freshness?.sequence,
        epoch: session.epoch
      })
      session.registered = true
      s.lastWriteMs = now
      s.lastRecord = record
      s.writes++
      s.failuresInRow = 0
      s.leaseLossesInRow = 0
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

  return { step, setState }
}
