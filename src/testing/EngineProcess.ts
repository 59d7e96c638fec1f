/**
 * A controllable in-memory EngineProcess for other services' tests: nothing is spawned; the test sets the
 * state (and records exits) by hand through EngineProcessControl and observes what its subject does.
 * `stop` behaves like the live one (Stopping, then Stopped with the last exit) and is idempotent.
 */
import { Clock, Context, Effect, Layer, Ref, Stream, SubscriptionRef } from "effect"
import type { LaunchPlan } from "../services/engine/Engine.ts"
import {
  EngineProcess,
  type EngineState,
  type ExitRecord,
  fromRefs,
  type RestartRequest,
  type RestartSource,
  type RunEnd,
  RunEndWords
} from "../services/engine/EngineProcess.ts"
import { State } from "../services/engine/EngineState.ts"

export class EngineProcessControl extends Context.Service<
  EngineProcessControl,
  {
    /** Publishes a state (every subscriber of `changes` sees it). */
    readonly set: (state: EngineState) => Effect.Effect<void>
    /** Records an ended run (newest first in `exits`) and counts a restart. */
    readonly recordExit: (exit: ExitRecord) => Effect.Effect<void>
    /** The reasons of the restarts requested while Ready, oldest first (a request does not change the state). */
    readonly restartRequests: Effect.Effect<ReadonlyArray<RestartRequest>>
    /** How many times `changes` has been subscribed to so far (read it before what makes the subject subscribe). */
    readonly subscriptions: Effect.Effect<number>
    /**
     * Until `changes` has been subscribed to `n` times: a subject now waits on the supervisor's next state, so a
     * state set after this is one it learns from `changes`, not from reading `state` (the latest is replayed to a
     * new subscriber, so one set while it subscribes is seen too). No sleeps: a test sets its state at this point.
     */
    readonly awaitSubscriptions: (n: number) => Effect.Effect<void>
  }
>()("cgn-agent/EngineProcessControl") {}

/** A vLLM-shaped plan on 127.0.0.1:8000; override what the test needs. */
export const testPlan = (overrides: Partial<LaunchPlan> = {}): LaunchPlan => ({
  kind: "vllm",
  spawns: true,
  argv: ["vllm", "serve", "org/m"],
  env: {},
  baseUrl: "http://127.0.0.1:8000",
  host: "127.0.0.1",
  port: 8000,
  probe: { kind: "http", url: "http://127.0.0.1:8000/health" },
  metrics: undefined,
  kvEvents: undefined,
  servedModel: "m",
  requestModel: "m",
  ...overrides
})

/** An ended run's record (code 1 after 1 ms) for tests that hand the supervisor's states around. */
export const testExit = (run: number, endedBy: RunEnd = { kind: "exited" }): ExitRecord => ({
  run,
  pid: 1,
  code: 1,
  signal: null,
  startedAt: 0,
  endedAt: 1,
  runtimeMs: 1,
  reason: RunEndWords.record(endedBy),
  endedBy,
  lastLines: [],
  oomKills: undefined,
  memoryLimitBytes: undefined
})

export const layerTest = (
  options: { readonly plan?: LaunchPlan; readonly initial?: EngineState } = {}
): Layer.Layer<EngineProcess | EngineProcessControl> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const state = yield* SubscriptionRef.make<EngineState>(
        options.initial ?? State.Starting({ phase: "loading", since: yield* Clock.currentTimeMillis, run: 0 })
      )
      const exits = yield* Ref.make<ReadonlyArray<ExitRecord>>([])
      const restarts = yield* Ref.make(0)
      const pid = yield* Ref.make<number | undefined>(undefined)
      const stop = Effect.gen(function* () {
        const s = yield* SubscriptionRef.get(state)
        if (s._tag === "Stopped") return
        yield* SubscriptionRef.set(state, State.Stopping({ since: yield* Clock.currentTimeMillis }))
        const [last] = yield* Ref.get(exits)
        yield* SubscriptionRef.set(state, State.Stopped({ lastExit: last }))
      })
      const plan = options.plan ?? testPlan()
      const requests = yield* Ref.make<ReadonlyArray<RestartRequest>>([])
      const restart = (source: RestartSource, reason: string) =>
        Effect.gen(function* () {
          if (!plan.spawns) return "not-spawned" as const
          const tag = (yield* SubscriptionRef.get(state))._tag
          // as the live supervisor: an operator's request in a restart backoff ends the wait
          const backoff = tag === "Restarting" && source === "admin"
          if (tag !== "Ready" && !backoff) return "not-ready" as const
          yield* Ref.update(requests, (xs) => [...xs, { source, reason }])
          return backoff ? ("backoff-ended" as const) : ("restarting" as const)
        })
      const subscribed = yield* SubscriptionRef.make(0)
      const engine = EngineProcess.of({
        ...fromRefs({ plan, state, restarts, exits, pid, restart, stop }),
        // counted, so a test can act once its subject waits on the next state (awaitSubscriptions)
        changes: Stream.unwrap(
          Effect.as(
            SubscriptionRef.update(subscribed, (n) => n + 1),
            SubscriptionRef.changes(state)
          )
        )
      })
      const control = EngineProcessControl.of({
        set: (s) => SubscriptionRef.set(state, s),
        recordExit: (exit) =>
          Ref.update(exits, (xs) => [exit, ...xs].slice(0, 20)).pipe(
            Effect.andThen(Ref.update(restarts, (n) => n + 1))
          ),
        restartRequests: Ref.get(requests),
        subscriptions: SubscriptionRef.get(subscribed),
        awaitSubscriptions: (n) =>
          SubscriptionRef.changes(subscribed).pipe(
            Stream.filter((count) => count >= n),
            Stream.take(1),
            Stream.runDrain
          )
      })
      return Context.make(EngineProcess, engine).pipe(Context.add(EngineProcessControl, control))
    })
  )
