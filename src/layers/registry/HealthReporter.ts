/**
 * Live HealthReporter: one fiber that grants a lease, creates `${prefix}/${cluster}/nodes/${node_id}` if
 * absent, keeps the lease alive and rewrites the NodeHealth JSON every heartbeat (one round:
 * registrationStep.ts); recovers from etcd outages (backoff with jitter, capped at one heartbeat) and from
 * lost leases (new lease, new epoch); refuses a node id held by another live lease. On release it writes
 * state=draining (unless etcd left the drain's draining write unanswered), then revokes the lease as the very
 * last step so the key disappears at once; each call is bounded (etcdClient.ts). Nothing it does can stop the
 * agent. This module holds the loop, the out-of-band writes and the shutdown.
 */
import { Clock, Duration, Effect, Exit, Fiber, Layer, Random, Semaphore, Stream } from "effect"
import { Config } from "../../services/config/Config.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import {
  HealthReporter,
  type HealthReporterService,
  nodeKey,
  type ReporterError,
  standaloneStatus
} from "../../services/registry/HealthReporter.ts"
import { afterLeaseLossMs, backoffMs, reporterTiming } from "../../services/registry/ReporterTiming.ts"
import { background } from "../observability/backgroundFiber.ts"
import { type EtcdOps, makeEtcdOps } from "./etcdClient.ts"
import { makeLeaseRecord } from "./leaseRecord.ts"
import { makeRegistrationStep, type StepReason } from "./registrationStep.ts"
import { initialReporterState, statusOf } from "./reporterState.ts"

const standalone = (nodeId: string): Effect.Effect<HealthReporterService> =>
  Effect.gen(function* () {
    yield* Effect.logInfo(
      `standalone: [cluster].etcd is empty, so node "${nodeId}" is not registered in etcd and no router will discover it`
    )
    return {
      status: Effect.succeed(standaloneStatus),
      lastRecord: Effect.succeed(undefined),
      markDraining: Effect.void,
      flush: Effect.void,
      reloadTls: Effect.undefined
    }
  })

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
  const s = initialReporterState()
  // Read before the first grant replaces it: the lease of this node's previous agent, if it died holding the key.
  const leaseRecord = yield* makeLeaseRecord(agent.state_dir, key)
  const { step, setState } = makeRegistrationStep({ s, ops, key, timing, agent, nodeStatus, leaseRecord })

  /** Runs a step under the lock and updates the state for its failure; returns the delay before the next one. */
  const round = (reason: StepReason) =>
    lock.withPermits(1)(
      step(reason).pipe(
        Effect.as(timing.tickMs),
        Effect.catch((e: ReporterError) =>
          Effect.gen(function* () {
            if (e._tag === "LeaseLost") {
              s.leasesLost++
              s.leaseLossesInRow++
              s.failuresInRow = 0
              // Logged with the lost lease's epoch, then forgotten.
              yield* setState("revoked")
              s.session = undefined
              return afterLeaseLossMs(s.leaseLossesInRow, timing.heartbeatMs, yield* Random.next)
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
            s.leasesLost++
            s.leaseLossesInRow++
            yield* setState("revoked")
            s.session = undefined
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
      // etcd refused the drain's own draining write or left it unanswered (partitioned, paused): a second try would
      // cost one more call deadline before the revoke, on every hung shutdown, and the revoke removes the key anyway.
      if (s.drainWriteFailed)
        yield* Effect.logWarning(
          `etcd: state=draining was never written (${s.lastError ?? "etcd did not answer during the drain"}); revoking the lease without retrying it`
        )
      else
        yield* step("shutdown").pipe(
          Effect.catch((e) => Effect.logWarning(`etcd: could not write state=draining before revoking: ${e.message}`))
        )
    }
    // The draining write's refusal may have revoked the lease already (registrationStep.ts withdraw).
    if (s.session !== session) return
    // Last step: the key goes with the lease, at once.
    yield* ops.revoke(session.id).pipe(
      Effect.tap(() =>
        Effect.logInfo(
          session.registered
            ? "etcd lease revoked, node key removed"
            : "etcd lease revoked (no key was written under it)"
        ).pipe(Effect.annotateLogs({ key, epoch: session.epoch }))
      ),
      // gone: no record of it is left for the next agent (one left, as by a failed revoke, names a lease it may revoke)
      Effect.andThen(leaseRecord.remove),
      Effect.catch((e) => Effect.logWarning(`etcd: lease revoke failed, the key expires after its TTL: ${e.message}`))
    )
    s.session = undefined
  })

  // A defect of a round (a bug building the record) would end the heartbeat for the process, the key left to expire
  // while /status says `registered`: said, and the loop runs again with the reporter's own backoff (capped at one
  // heartbeat), the next round taking up the lease as any round after a failure does.
  const restart = { baseMs: 100, capMs: timing.heartbeatMs }
  const loopFiber = yield* loop.pipe(
    background("the etcd heartbeat", "the node's record in etcd is no longer written nor its lease kept alive", {
      restart
    }),
    Effect.annotateLogs({ component: "HealthReporter" }),
    Effect.forkScoped
  )
  // A state change goes out at once, not at the next heartbeat: draining, a cordon, an engine's teardown (a liveness
  // loss included: it ends the run) or an engine becoming ready is written as it happens, undamped (buildRecord).
  const drainFiber = yield* nodeStatus.changes.pipe(
    Stream.runForEach((st) => writeNow(st === "draining" ? "drain" : "change").pipe(Effect.ignore)),
    background("the etcd state-change writer", "a change of the node's state waits for the next heartbeat", {
      restart
    }),
    Effect.annotateLogs({ component: "HealthReporter" }),
    Effect.forkScoped
  )
  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      yield* Fiber.interrupt(drainFiber)
      yield* Fiber.interrupt(loopFiber)
      yield* lock.withPermits(1)(shutdown)
    }).pipe(Effect.annotateLogs({ component: "HealthReporter" }))
  )

  const status = Effect.map(Clock.currentTimeMillis, (now) => statusOf(s, key, now))

  const service: HealthReporterService = {
    status,
    lastRecord: Effect.sync(() => s.lastRecord),
    markDraining: Effect.suspend(() => {
      s.forcedDraining = true
      // A failure, or the caller's deadline interrupting it, tells the shutdown that etcd is not answering.
      return writeNow("drain").pipe(
        Effect.onExit((exit) =>
          Effect.sync(() => {
            s.drainWriteFailed = Exit.isFailure(exit)
          })
        ),
        Effect.annotateLogs({ component: "HealthReporter" })
      )
    }),
    flush: writeNow("flush").pipe(Effect.annotateLogs({ component: "HealthReporter" })),
    reloadTls:
      cluster.etcd_ca_file === undefined && cluster.etcd_cert_file === undefined
        ? Effect.undefined
        : // not once the shutdown has begun: its finalizer closes the client, and a new one would be left open
          Effect.suspend(() => (s.stopping ? Effect.succeed(false) : ops.reloadTls)).pipe(
            Effect.flatMap((changed) =>
              Effect.as(
                Effect.logInfo(
                  changed
                    ? "SIGHUP: etcd TLS files reloaded (connections to etcd made from now on use them)"
                    : "SIGHUP: etcd TLS files unchanged"
                ),
                undefined
              )
            ),
            Effect.catch((e) =>
              Effect.as(Effect.logWarning(`SIGHUP: keeping the previous etcd TLS files: ${e.message}`), e.message)
            ),
            Effect.annotateLogs({ component: "HealthReporter" })
          )
  }
  return service
})

/** The live layer; fails only when a TLS file named in [cluster] cannot be read. */
export const layer = Layer.effect(HealthReporter, make)
