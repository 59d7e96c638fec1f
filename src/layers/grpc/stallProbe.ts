/**
 * The way back from a stall when no call comes to show it: while the engine is taken as stalled (EngineStall) and no
 * Generate call is in flight, the stall watchdog asks the engine itself for a short completion, at most once per
 * engine.stream_idle_timeout and one at a time. One that completes clears the stall as a call would; one that fails
 * or does not finish within the idle timeout leaves it. Without it, a node taken out of traffic by its own stall
 * (routers that read NodeHealth send it nothing) could never see a call complete, and would stay out until its
 * engine was restarted, however soon the engine recovered. PROBE_TOKENS is above the few tokens an engine that
 * stalls every stream early still sends, so such an engine fails the probe. SGLang's /health_generate does the same
 * with one token (python/sglang/srt/entrypoints/http_server.py health_generate). A server without one of the two
 * OpenAI endpoints (a chat-only openai_compat server answers /v1/completions 404) is asked on the other: after a 404,
 * 405 or 501 the probe tries the other one at once, and keeps to it once it has completed there. Not before: vLLM
 * answers 404 for an unknown model too (vllm/entrypoints/openai/serving_engine.py _check_model), and a stray 404
 * must not move the probe to an endpoint the server does not serve. On a prefill or decode node the request carries
 * what the engine needs to serve it with no peer (Engine.capabilities.peerlessFields: SGLang's fake bootstrap host,
 * and room 0, as its own /health_generate sends; with dp > 1, one request per rank, rooms 0 to dp - 1, all of which
 * must complete); an SGLang prefill server answers such a request with one token, as every prefill leg.
 */
import { Clock, Duration, Effect, type Scope } from "effect"
import type { EngineKind, Role } from "../../services/config/Config.ts"
import {
  type CompletionPath,
  complete,
  type EngineClientService,
  EngineError
} from "../../services/engine/EngineClient.ts"
import type { EngineStallService } from "../../services/engine/EngineStall.ts"
import { engineFor } from "../engine/backends/index.ts"

/** Tokens the probe asks for: more than an early-stalling engine sends, few enough to cost the engine nothing. */
export const PROBE_TOKENS = 16

/** What the probe's requests add to the OpenAI fields for one engine kind in one role. */
export interface ProbeShape {
  /** The engine takes `ignore_eos` (Engine.capabilities.ignoreEos). */
  readonly ignoreEos: boolean
  /**
   * The fields that let the engine serve a request with no P/D peer (Engine.capabilities.peerlessFields), one set per
   * request the probe sends: one per data-parallel rank where a field picks the rank (peerlessRankField), else one.
   */
  readonly requests: ReadonlyArray<Readonly<Record<string, string | number>>>
}

export const probeShape = (kind: EngineKind, role: Role, dp = 1): ProbeShape => {
  const caps = engineFor(kind).capabilities
  const fields = caps.peerlessFields?.[role]
  const rank = caps.peerlessRankField
  const requests =
    fields === undefined
      ? [{}]
      : rank === undefined || dp <= 1
        ? [fields]
        : Array.from({ length: dp }, (_, i) => ({ ...fields, [rank]: i }))
  return { ignoreEos: caps.ignoreEos === true, requests }
}

/**
 * The probe's request on `path`; the client adds the model (and `stream: false`). With `ignore_eos` the engine
 * generates all PROBE_TOKENS, so a model's early end cannot pass for a working engine; elsewhere the request carries
 * only OpenAI fields, and the shape's P/D fields.
 */
export const probeBody = (
  path: CompletionPath,
  shape: ProbeShape,
  fields: Readonly<Record<string, string | number>> = shape.requests[0] ?? {}
) => ({
  ...(path === "/v1/completions" ? { prompt: "ping" } : { messages: [{ role: "user", content: "ping" }] }),
  max_tokens: PROBE_TOKENS,
  temperature: 0,
  ...(shape.ignoreEos ? { ignore_eos: true } : {}),
  ...fields
})

/** The engine has no such endpoint (or not for POST): the other one may serve. */
const noEndpoint = (e: EngineError) => e.reason === "Http" && (e.status === 404 || e.status === 405 || e.status === 501)

const otherPath = (path: CompletionPath): CompletionPath =>
  path === "/v1/completions" ? "/v1/chat/completions" : "/v1/completions"

/**
 * The probe runner of one watchdog. `stalled(now)` starts a probe when one is due while the engine is taken as stalled
 * (its completion clears the stall); `idle(now)` sends the same test to an engine that has had no call for
 * `idleFor` (engine.idle_probe_after), and one that gets no answer in time takes the engine as stalled
 * (EngineStall.idleProbeFailed). The caller checks stalled, idle and Ready; one probe at a time.
 */
export const stallProbe = (
  client: EngineClientService,
  stall: EngineStallService,
  idleMs: number,
  shape: ProbeShape,
  scope: Scope.Scope,
  idleFor = "0s",
  ready: Effect.Effect<boolean> = Effect.succeed(true)
) => {
  let inFlight = false
  let nextAt = Number.NEGATIVE_INFINITY
  let lastFailure: string | undefined
  let path: CompletionPath = "/v1/completions"
  const noAnswer = new EngineError({
    reason: "Timeout",
    message: `no answer within ${Duration.format(Duration.millis(idleMs))}`
  })

  // every request must complete (one per data-parallel rank where the engine lets the probe pick it)
  const ask = (on: CompletionPath) =>
    Effect.forEach(shape.requests, (fields) => complete(client, on, probeBody(on, shape, fields)), {
      concurrency: "unbounded",
      discard: true
    })
  const request = Effect.suspend(() => ask(path)).pipe(
    Effect.catchIf(noEndpoint, () =>
      Effect.suspend(() => {
        const other = otherPath(path)
        return Effect.tap(ask(other), () =>
          Effect.sync(() => {
            path = other
          })
        )
      })
    ),
    Effect.timeoutOrElse({ duration: Duration.millis(idleMs), orElse: () => Effect.fail(noAnswer) })
  )
  /**
   * A warning per new reason a test failed for (the same one each time would fill the log); none when the engine is no
   * longer Ready: a run ended under the test (a restart, a drain's stop) broke it, which says nothing of the engine.
   */
  const failed = (e: EngineError, message: string) =>
    Effect.flatMap(ready, (stillReady) => {
      if (!stillReady || e.message === lastFailure) return Effect.void
      lastFailure = e.message
      return Effect.logWarning(message, { error: e.message, next_try_in: Duration.format(Duration.millis(idleMs)) })
    })
  const done = Effect.sync(() => {
    inFlight = false
  })

  const whileStalled = request.pipe(
    Effect.matchEffect({
      onSuccess: () =>
        Effect.gen(function* () {
          lastFailure = undefined
          // the stall's end is logged once, by EngineStall, with this as its cause
          yield* stall.completed(
            yield* Clock.currentTimeMillis,
            `the engine completed a test request while stalled and idle (max_tokens ${PROBE_TOKENS}, ${path})`
          )
        }),
      onFailure: (e) => failed(e, "the engine failed a test request while stalled and idle: still stalled")
    }),
    Effect.ensuring(done)
  )

  // Only no answer at all is a wedge: an error the engine answers with (a 4xx for a request it will not take, a 5xx of
  // a dead core, which liveness sees) or a refused connection says it is not hung, and is logged instead.
  const whileIdle = request.pipe(
    Effect.matchEffect({
      onSuccess: () =>
        Effect.sync(() => {
          lastFailure = undefined
        }),
      onFailure: (e) =>
        e.reason === "Timeout"
          ? Effect.flatMap(Effect.zip(ready, Clock.currentTimeMillis), ([stillReady, now]) =>
              stillReady ? stall.idleProbeFailed({ since: now, idleFor }) : Effect.void
            )
          : failed(e, "the engine failed a test request sent while idle: not taken as stalled (only no answer is)")
    }),
    Effect.ensuring(done)
  )

  const start = (now: number, probe: Effect.Effect<void>): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (inFlight || now < nextAt) return Effect.void
      inFlight = true
      nextAt = now + idleMs
      return Effect.asVoid(Effect.forkIn(probe, scope))
    })

  return {
    stalled: (now: number): Effect.Effect<void> => start(now, whileStalled),
    idle: (now: number): Effect.Effect<void> => start(now, whileIdle)
  }
}
