/**
 * AgentShortage: the agent itself short of what it needs to reach its engine (file descriptors, socket buffers, local
 * ports: HostShortage.ts), seen in the calls and probes it could not send. Such a call ends `UNAVAILABLE`,
 * `cgn-reason agent_resources`, and is never counted against the engine (EngineStatus.ts, the `Local` row); yet a
 * node whose every call so fails in microseconds, with no load, reads `ready` and draws the routers' traffic, as an
 * engine failing calls did (FailedCalls.ts). So, as there: calls refused so in a row (engine.failed_calls_unhealthy,
 * no call completing between them) or probes unsent in a row (engine.liveness_failures: what would have judged the
 * engine) take the agent as short, and the node `unhealthy` with the reason, until a test shows the host can give it
 * a socket again: a fresh connection to the engine's port (a completed call or a sent probe proves nothing of it:
 * either may ride a keep-alive connection opened before). The engine is never restarted for it. Not damped
 * (FlapDamping.ts): an agent at the edge of its limit may go in and out of traffic, cleared at most once per
 * engine.liveness_interval. The decisions are pure here (`stepShortage`); `make` keeps the state, the live layer
 * runs the test.
 */
import { Clock, Context, Data, Effect, PubSub, Ref, Stream } from "effect"

/** Probes unsent in a row since one was last sent, and the last shortage's words. */
export interface ShortageRun {
  readonly probes: number
  readonly last: string
}

/** The agent taken as short: since when (epoch ms, Effect's Clock) and the last shortage's words. */
export interface AgentShort {
  readonly since: number
  readonly last: string
}

export interface ShortageView {
  readonly run: ShortageRun | undefined
  readonly short: AgentShort | undefined
}

export const noShortage: ShortageView = { run: undefined, short: undefined }

/** What the agent saw since it last looked. */
export type ShortageEvent = Data.TaggedEnum<{
  /**
   * Calls ended `agent_resources` in a row, with no call completing between them, as many as `inRow` at the most
   * since the last look (ActiveCalls counts the run, in the order calls end); the last with `last` (its status
   * message). A completed call ends such a run, never the shortage: its connection may be an old one.
   */
  CallsRefused: { readonly inRow: number; readonly last: string }
  /** A readiness or liveness probe the host could not open a connection for (`reason`: what ran out). */
  ProbeUnsent: { readonly reason: string }
  /** A probe reached the engine (whatever it answered): the run of unsent probes ends. */
  ProbeSent: {}
  /** The test got a socket (a connection made, refused by a closed port, or pending once resolved): no shortage. */
  TestPassed: {}
}>
export const ShortageEvent = Data.taggedEnum<ShortageEvent>()

/**
 * In a row before the agent is taken as short; 0 calls: calls never take it so (engine.failed_calls_unhealthy's 0).
 * Probes: readiness and liveness probes alike (a start's probes come every half second, so an agent out of
 * descriptors while its engine loads reads unhealthy, with why, within a couple of seconds rather than `starting`).
 */
export interface ShortageLimits {
  readonly calls: number
  readonly probes: number
}

/** The view after `event` at `now`. */
export const stepShortage = (
  view: ShortageView,
  event: ShortageEvent,
  limits: ShortageLimits,
  now: number
): ShortageView => {
  const run = view.run ?? { probes: 0, last: "" }
  const taken = (next: ShortageRun, reached: boolean): ShortageView => ({
    run: next,
    short:
      view.short !== undefined
        ? { ...view.short, last: next.last }
        : reached
          ? { since: now, last: next.last }
          : undefined
  })
  switch (event._tag) {
    case "CallsRefused":
      if (event.inRow <= 0) return view
      return taken({ ...run, last: event.last }, limits.calls > 0 && event.inRow >= limits.calls)
    case "ProbeUnsent": {
      const next = { probes: run.probes + 1, last: event.reason }
      return taken(next, next.probes >= limits.probes)
    }
    case "ProbeSent":
      return view.run === undefined ? view : { ...view, run: { ...run, probes: 0 } }
    case "TestPassed":
      return noShortage
  }
}

/** The node's reason while the agent is short. */
export const shortageProblem = (s: AgentShort): string =>
  `the agent is short of resources to reach its engine (calls end UNAVAILABLE, cgn-reason agent_resources; the engine is not restarted for it): ${s.last}`

export interface AgentShortageService {
  /** Folds in what was seen; transitions are logged and emitted on `changes`. */
  readonly report: (event: ShortageEvent) => Effect.Effect<void>
  /** The shortage now, or undefined. */
  readonly current: Effect.Effect<AgentShort | undefined>
  /** Emits the shortage (or undefined) on every change of whether the agent is short. */
  readonly changes: Stream.Stream<AgentShort | undefined>
}

export class AgentShortage extends Context.Service<AgentShortage, AgentShortageService>()("cgn-agent/AgentShortage") {}

/** The state machine; one event at a time. */
export const make = (limits: ShortageLimits): Effect.Effect<AgentShortageService> =>
  Effect.gen(function* () {
    const view = yield* Ref.make(noShortage)
    const hub = yield* PubSub.unbounded<AgentShort | undefined>()
    const report = (event: ShortageEvent) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const [before, after] = yield* Ref.modify(view, (v) => {
          const next = stepShortage(v, event, limits, now)
          return [[v.short, next.short] as const, next]
        })
        if ((before === undefined) === (after === undefined)) return
        if (after !== undefined)
          yield* Effect.logWarning(`node unhealthy: ${shortageProblem(after)}`, { shortage: "agent" })
        else
          yield* Effect.logInfo(
            "the agent can open connections to its engine again: the node is no longer unhealthy for its shortage",
            { shortage: "agent" }
          )
        yield* PubSub.publish(hub, after)
      })
    return AgentShortage.of({
      report,
      current: Effect.map(Ref.get(view), (v) => v.short),
      changes: Stream.fromPubSub(hub)
    })
  })
