/**
 * The supervisor's watch over one run: readiness within the startup budget, then liveness with a failure
 * threshold. Each publishes what it sees and completes only with the reason the run must end. Every time is
 * Effect's Clock and every wait Effect.sleep, so a TestClock drives them.
 */
import { Clock, Deferred, Effect, Ref } from "effect"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import type { EngineHostService, PortHolder, ProbeResult } from "../../services/engine/EngineHost.ts"
import {
  type RequestedEnd,
  type RestartRequest,
  type RunEnd,
  RunEndWords
} from "../../services/engine/EngineProcess.ts"
import { Event, livenessStep, type SupervisorEvent } from "../../services/engine/EngineState.ts"
import { type AgentShortageService, ShortageEvent } from "../../services/node/AgentShortage.ts"
import type { MemoryCgroupService } from "../../services/node/MemoryCgroup.ts"
import type { SupervisorSettings } from "./supervisorSettings.ts"

/** What the supervisor's parts share: the plan, the settings, the host seam and the one state writer. */
export interface Supervision {
  readonly plan: LaunchPlan
  readonly settings: SupervisorSettings
  readonly host: EngineHostService
  readonly publish: (event: SupervisorEvent) => Effect.Effect<void>
  /** The agent's memory cgroup, read at each run's spawn and end (OOM kills); undefined: not known. */
  readonly memory: MemoryCgroupService | undefined
  /**
   * Set while a run is Ready and watched for liveness: completing it (EngineProcess.restart) ends that run with the
   * given reason. Undefined otherwise, so a request never reaches a run that is starting or already ending.
   */
  readonly endReadyRun: Ref.Ref<Deferred.Deferred<RestartRequest> | undefined>
  /** Told of each probe the agent's host could or could not send (AgentShortage.ts); undefined: not told. */
  readonly shortage: AgentShortageService | undefined
}

const now = Clock.currentTimeMillis

/** Tells AgentShortage whether the probe was sent: not when the agent's host could not open its connection. */
const probeSeen = (s: Supervision, r: ProbeResult): Effect.Effect<void> =>
  s.shortage === undefined
    ? Effect.void
    : s.shortage.report(
        !r.ok && r.inconclusive === true ? ShortageEvent.ProbeUnsent({ reason: r.reason }) : ShortageEvent.ProbeSent()
      )

/** One run as its watch sees it. */
export interface WatchedRun {
  readonly run: number
  /** When it was spawned: the startup budget runs from here. */
  readonly since: number
  /** Completed when it turns Ready. */
  readonly readyAt: Deferred.Deferred<number>
  /** Who listens on the engine's port: an answer from a listener outside the engine's group is not the engine's. */
  readonly holder: Effect.Effect<PortHolder>
}

/**
 * Probes until Ready (completing `readyAt`) or the startup budget is spent; false on a timeout. The time from a probe
 * the agent's host could not send (its own shortage: probe.ts) to the next probe is not the engine's: the deadline
 * moves by it, so an agent out of descriptors does not end, again and again, an engine still loading its model.
 */
const readiness = (s: Supervision, { run, since, readyAt, holder }: WatchedRun) =>
  Effect.gen(function* () {
    const { plan, settings } = s
    let deadline = since + settings.startupTimeoutMs
    let lastLog = since
    let warned = false
    let notSent = false
    for (;;) {
      const remaining = deadline - (yield* now)
      if (remaining <= 0) {
        yield* s.publish(Event.StartupTimedOut({ budgetMs: settings.startupTimeoutMs, at: yield* now }))
        return false
      }
      let r: ProbeResult = yield* s.host.probe(plan.probe, Math.min(remaining, 10_000))
      yield* probeSeen(s, r)
      if (!r.ok && r.inconclusive === true) {
        if (!notSent)
          yield* Effect.logWarning(
            `engine run ${run}: readiness probe not sent: ${r.reason}; engine.startup_timeout waits until probes are sent again`
          )
        notSent = true
        const before = yield* now
        yield* s.publish(Event.Phase({ phase: r.phase, at: before }))
        yield* Effect.sleep(settings.probeIntervalMs)
        deadline += (yield* now) - before
        continue
      }
      if (notSent) yield* Effect.logInfo(`engine run ${run}: readiness probes sent again`)
      notSent = false
      // The holder waits until the engine's pid is known (run.ts): not Ready meanwhile, and never past the budget.
      const who = r.ok
        ? yield* holder.pipe(
            Effect.timeoutOrElse({ duration: Math.max(1, deadline - (yield* now)), orElse: () => Effect.undefined })
          )
        : undefined
      if (r.ok && who === undefined) {
        r = { ok: false, reason: "the engine's pid is not known yet", phase: "waiting for the engine's pid" }
      } else if (r.ok && who === "other") {
        r = {
          ok: false,
          reason: `port ${plan.port} answers, but no process of the engine's group listens on it`,
          phase: "port held by another process"
        }
        if (!warned) {
          warned = true
          yield* Effect.logWarning(
            `engine run ${run}: port ${plan.port} is answered by a process outside the engine's process group (an engine left by an earlier run, or another service); not Ready while it holds the port (an engine.command that runs the engine outside the agent's process group, e.g. in a container, needs engine.verify_listener = false)`
          )
        }
      }
      yield* Effect.logDebug("engine readiness probe", { run, url: plan.probe.url, ...r })
      if (r.ok) {
        const at = yield* now
        yield* Deferred.succeed(readyAt, at)
        yield* s.publish(Event.ProbeOk({ at }))
        return true
      }
      yield* s.publish(Event.Phase({ phase: r.phase, at: yield* now }))
      const at = yield* now
      if (at - lastLog >= settings.progressEveryMs) {
        lastLog = at
        yield* Effect.logInfo(
          `engine run ${run} starting: phase=${r.phase} elapsed=${Math.round((at - since) / 1000)}s ` +
            `budget=${Math.round(settings.startupTimeoutMs / 1000)}s (${r.reason})`
        )
      }
      yield* Effect.sleep(Math.max(0, Math.min(settings.probeIntervalMs, deadline - (yield* now))))
    }
  })

/**
 * Probes every liveness interval, start to start, as the kubelet's prober does (a ticker of periodSeconds:
 * kubernetes/kubernetes pkg/kubelet/prober/worker.go `run`); completes when `livenessFailures` probes in a row
 * failed. Each probe is bounded by min(interval, 5 s), so it ends before the next is due: a hung engine fails
 * one probe per interval (3 × 5 s), not one per interval plus timeout (3 × 10 s, as when the wait followed it);
 * an engine whose answer takes its time by design (LaunchPlan.livenessTimeoutFloorMs) is given at least that.
 */
const liveness = (s: Supervision): Effect.Effect<RunEnd> =>
  Effect.gen(function* () {
    const { plan, settings } = s
    const live = plan.liveness ?? plan.probe
    let failures = 0
    // while probes cannot be sent (the agent's own shortage): warned of once, until one is sent again
    let notSent = false
    let next = (yield* now) + settings.livenessIntervalMs
    for (;;) {
      yield* Effect.sleep(Math.max(0, next - (yield* now)))
      next = (yield* now) + settings.livenessIntervalMs
      const r = yield* s.host.probe(
        live,
        Math.max(plan.livenessTimeoutFloorMs ?? 0, Math.min(settings.livenessIntervalMs, 5_000))
      )
      yield* Effect.logDebug("engine liveness probe", { url: live.url, ...r })
      yield* probeSeen(s, r)
      if (!r.ok && r.inconclusive === true) {
        // the agent's own shortage, not the engine's answer: the count stays as it was
        if (!notSent) yield* Effect.logWarning(`liveness probe not sent: ${r.reason}; not counted against the engine`)
        notSent = true
        continue
      }
      if (notSent) yield* Effect.logInfo("liveness probes sent again")
      notSent = false
      const step = livenessStep(failures, r.ok, settings.livenessFailures)
      if (!r.ok)
        yield* Effect.logWarning(`liveness probe failed (${step.failures}/${settings.livenessFailures}): ${r.reason}`)
      else if (failures > 0) yield* Effect.logInfo("liveness probe recovered")
      failures = step.failures
      if (step.lost && !r.ok) {
        const reason = `${failures} liveness probes failed in a row, last: ${r.reason}`
        yield* s.publish(Event.LivenessLost({ reason, at: yield* now }))
        return { kind: "unhealthy", reason }
      }
    }
  })

/** Liveness, or an end requested while Ready (EngineProcess.restart), published as the loss of the Ready state. */
const readyUntilEnd = (s: Supervision) =>
  Effect.gen(function* () {
    const requested = yield* Deferred.make<RestartRequest>()
    yield* Ref.set(s.endReadyRun, requested)
    const ended = Effect.gen(function* () {
      const { source, reason } = yield* Deferred.await(requested)
      const end: RequestedEnd = { kind: "requested", source, reason }
      yield* s.publish(Event.LivenessLost({ reason: RunEndWords.ending(end), at: yield* now, ending: end }))
      return end
    })
    return yield* Effect.raceFirst(liveness(s), ended)
  }).pipe(Effect.ensuring(Ref.set(s.endReadyRun, undefined)))

/** Readiness, then liveness: completes only with why the run must end; `readyAt` says when it was Ready. */
export const watchRun = (s: Supervision, w: WatchedRun): Effect.Effect<RunEnd> =>
  Effect.flatMap(
    // One span per run's start, spawn to Ready (or the startup timeout; interrupted when the run exits first): the
    // minutes a real engine's load takes, in the same traces as the calls.
    readiness(s, w).pipe(
      Effect.tap((ready) => Effect.annotateCurrentSpan("cgn.engine.ready", ready)),
      Effect.withSpan("cgn.agent.engine.start", {
        attributes: { "cgn.engine.run": w.run, "cgn.engine.kind": s.plan.kind }
      })
    ),
    (ready) => (ready ? readyUntilEnd(s) : Effect.succeed({ kind: "startupTimeout" } as const))
  )
