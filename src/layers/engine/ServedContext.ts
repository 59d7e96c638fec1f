/**
 * The live ServedContext: once per Ready period of the engine (a run that became Ready; for openai_compat, the proxied
 * server answering again), a GET of the model list its backend names (`capabilities.servedContext`), and the
 * per-request context it says kept in a Ref that ListModels and every Generate call read. No read on the call path.
 * A failed read (no such field, an error status, no answer) leaves the configured value in force, is logged, at info
 * the first time for a reason, at debug after, and is tried again with backoff while the period lasts; it never fails
 * a run or a call. Once said, it is read again every `rereadMs` while the period lasts: a server the agent does not
 * run (openai_compat) may be restarted with another context between two liveness probes, which no new period shows
 * (a review: a proxied llama-server back at once with `-c` 8x larger kept valid calls refused, and one 8x smaller
 * let calls be cut short); for an engine the agent runs the figure only changes with a new run, and the GET is cheap.
 * A re-read that fails keeps the last figure (only the engine's answer changes it).
 */
import { Effect, Layer, Random, Ref, Stream } from "effect"
import { getGlobalDispatcher } from "undici"
import { Config } from "../../services/config/Config.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import type { ServedContextSource } from "../../services/engine/Engine.ts"
import { EngineProcess, type EngineState } from "../../services/engine/EngineProcess.ts"
import { ServedContext, servedContextOf } from "../../services/engine/ServedContext.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { engineOfPlan } from "./backends/index.ts"
import { getText } from "./EngineClient.ts"
import { planRedactor } from "./engineHttp.ts"

/** Bound on the read (headers, then body): the engine client's own for its whole answers. */
const READ_TIMEOUT_MS = 10_000

const parse = (text: string, source: ServedContextSource, model: string): number | string => {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return `the answer of ${source.path} is not JSON`
  }
  return servedContextOf(body, source, model)
}

/** How often a said figure is read again while Ready. */
export const REREAD_MS = 30_000

export const layerWith = (options: {
  readonly rereadMs?: number
}): Layer.Layer<ServedContext, never, EngineProcess | Config> =>
  Layer.effect(
    ServedContext,
    Effect.gen(function* () {
      const rereadMs = options.rereadMs ?? REREAD_MS
      const engine = yield* EngineProcess
      const config = yield* Config
      const ref = yield* Ref.make<number | undefined>(undefined)
      const service = ServedContext.of({ current: () => Ref.getUnsafe(ref) })
      const plan = engine.plan
      const source = engineOfPlan(plan).capabilities.servedContext
      if (source === undefined) return service
      const url = `${plan.baseUrl}${source.path}`
      // the model list's errors are logged: scrubbed of the run's secrets as the calls' are
      const redact = planRedactor(plan)
      const configured = config.model.max_model_len
      const configKey = formatPath(["models", config.model.name, "max_model_len"])
      let lastProblem: string | undefined

      /**
       * One read: whether it is done, the engine having answered (with the value, or a list without it: a server whose
       * list has no such field says so every time); a transport or HTTP error is not, and is tried again.
       */
      const read = (keepOnFailure: boolean) =>
        Effect.gen(function* () {
          let answered = true
          const got = yield* getText(getGlobalDispatcher(), url, READ_TIMEOUT_MS, plan.authorization, redact).pipe(
            Effect.map((text) => parse(text, source, plan.servedModel)),
            Effect.catch((e) => {
              answered = false
              return Effect.succeed(`${source.path}: ${e.message}`)
            })
          )
          if (typeof got === "number") {
            lastProblem = undefined
            const before = yield* Ref.getAndSet(ref, got)
            if (before !== got)
              yield* Effect.logInfo("the engine says the context one request can use", {
                tokens: got,
                [configKey]: configured ?? "unset",
                from: url
              })
            return true
          }
          if (keepOnFailure && !answered) return false
          yield* Ref.set(ref, undefined)
          const log = got === lastProblem ? Effect.logDebug : Effect.logInfo
          lastProblem = got
          yield* log("could not read the context one request can use from the engine; the configured value stands", {
            reason: got,
            [configKey]: configured ?? "unset"
          })
          return answered
        })

      // Read again after a failed read (an engine slow to answer under load, a proxied server not up yet), 1 s doubling
      // to 30 s (the shared backoff), for as long as the Ready period lasts: one failed read must not leave the
      // configured value for the run.
      const readUntilSaid = Effect.gen(function* () {
        for (let failures = 1; !(yield* read(false)); failures++)
          yield* Effect.sleep(jitteredBackoffMs(failures, 30_000, yield* Random.next, 1_000))
        for (;;) {
          yield* Effect.sleep(rereadMs)
          yield* read(true)
        }
      })

      // Each new Ready period (run and time) reads; leaving it ends a read still retrying.
      const periodOf = (s: EngineState): string | undefined => (s._tag === "Ready" ? `${s.run}:${s.since}` : undefined)
      yield* engine.changes.pipe(
        Stream.map(periodOf),
        Stream.changes,
        Stream.switchMap((period) => (period === undefined ? Stream.empty : Stream.fromEffect(readUntilSaid))),
        Stream.runDrain,
        // followed again after a defect: the stream starts with the current state (its Ready period read again)
        background("the served-context reader", "the context the engine serves is no longer read at its starts", {
          restart: RESTART
        }),
        Effect.forkScoped
      )
      return service
    })
  )

export const layer = layerWith({})
