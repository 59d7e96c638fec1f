/**
 * A Generate call's engine failure, explained by the end of the engine run under it (services/grpc/EngineCut.ts):
 * "the engine is being restarted (POST /engine/restart by an operator): stream truncated: UND_ERR_SOCKET: other
 * side closed; retry on another node" rather than the transport's words alone. Only on a failed call's error path:
 * nothing per call or per read otherwise. And the calls in flight cut the moment the agent begins ending their run
 * itself (`cutOnRunEnd`). A proxied server (openai_compat) is not the agent's to restart or watch exit: its failures
 * keep their words, and its calls are never cut.
 */
import { Effect, Option, type Scope, Stream } from "effect"
import type { EngineError } from "../../services/engine/EngineClient.ts"
import { EngineProcess, type EngineState } from "../../services/engine/EngineProcess.ts"
import type { EngineRunEnded } from "../../services/grpc/CallErrors.ts"
import { agentCut, connectionBroke, explainCut, runEnding } from "../../services/grpc/EngineCut.ts"
import { endsUnavailable } from "../../services/grpc/GrpcStatus.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import type { ActiveCalls } from "./ActiveCalls.ts"

/**
 * How long a connection that broke while the engine still shows Ready waits for the supervisor's word on that run.
 * A restart is published before the engine is signalled, so its cut is explained at once; an engine that died by
 * itself closes its sockets before its exit reaches the agent (the orphan guard reaps it and reports it over a
 * pipe: milliseconds), so the call waits for that report, bounded. A run that stays Ready past it keeps the
 * transport's words (the connection broke for another reason); a caller's cancel or deadline ends the wait.
 */
export const EXIT_NOTICE_MS = 250

/** Explains a failed engine request, or undefined where there is nothing to explain by (no spawned engine). */
export type ExplainCut = (e: EngineError) => Effect.Effect<never, EngineError | EngineRunEnded>

export const make: Effect.Effect<ExplainCut | undefined> = Effect.gen(function* () {
  const engine = Option.getOrUndefined(yield* Effect.serviceOption(EngineProcess))
  if (engine === undefined || !engine.plan.spawns) return undefined
  /** The first state after Ready run `run` (its ending, if it ends within the bound), or that Ready state. */
  const afterReady = (ready: EngineState & { readonly _tag: "Ready" }): Effect.Effect<EngineState> =>
    engine.changes.pipe(
      Stream.filter((s) => !(s._tag === "Ready" && s.run === ready.run)),
      Stream.runHead,
      Effect.timeoutOption(EXIT_NOTICE_MS),
      Effect.map((s) => Option.getOrElse(Option.flatten(s), () => ready))
    )
  return (e) =>
    Effect.gen(function* () {
      // only a failure that ends the call UNAVAILABLE (its status is kept): an engine's 4xx is the request's fault
      if (!endsUnavailable(e)) return yield* Effect.fail(e)
      let state = yield* engine.state
      if (state._tag === "Ready" && connectionBroke(e)) state = yield* afterReady(state)
      const exits = state._tag === "Starting" ? yield* engine.exits : []
      return yield* Effect.fail(explainCut(e, runEnding(state, exits)))
    })
})

/**
 * Until the scope closes: the moment the supervisor publishes that the agent is ending the engine run (a restart asked
 * for, a stall restart, failed liveness: Unhealthy before the engine is signalled, layers/engine/watch.ts; or its
 * stop), every call in `active` ends with why (services/grpc/EngineCut.ts agentCut) and its engine request is aborted.
 * Left open, the streams would hold the engine up: llama-server does not exit on SIGTERM while one is open (its task
 * loop stops, the connection threads wait for results that never come), so a restart under load ended in SIGKILL
 * after the whole engine.stop_grace, the calls getting nothing meanwhile (a soak: 5 s of 5 s). Not a kind's
 * difference: vLLM's uvicorn would let open streams finish, but a run the agent ends is ended for every kind. The
 * drain ends its calls before it stops the engine, so it never meets this; a call it aborted keeps its words.
 */
export const cutOnRunEnd = (active: ActiveCalls): Effect.Effect<void, never, Scope.Scope> =>
  Effect.gen(function* () {
    const engine = Option.getOrUndefined(yield* Effect.serviceOption(EngineProcess))
    if (engine === undefined || !engine.plan.spawns) return
    // started at once: subscribed before the server takes a call, so no ending is missed
    yield* Stream.runForEach(engine.changes, (state) =>
      Effect.map(state._tag === "Starting" ? engine.exits : Effect.succeed([]), (exits) =>
        active.cutWhile(agentCut(state, exits))
      )
    ).pipe(
      // subscribed again after a defect: the stream starts with the current state, whose cut is the same
      background("the engine-run follower of the calls", "calls are no longer cut when the agent ends their run", {
        restart: RESTART
      }),
      Effect.forkScoped({ startImmediately: true })
    )
  })
