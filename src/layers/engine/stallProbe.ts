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
 * must complete); an SGLang prefill server answers such a request with one token, as every prefill leg. On vLLM
 * with dp > 1 the requests go one to each rank through its X-data-parallel-rank header, on SGLang through its
 * routed_dp_rank field (in every role; on a P/D node beside the room).
 * The same test is also how the watchdog finds what nothing else shows: an engine that wedged while idle (sent after
 * engine.idle_probe_after with no call) and a data-parallel rank that hangs alone while the others serve (sent to
 * each rank once a stream stalls); there no answer within the idle timeout takes the engine as stalled. And it judges
 * decode legs that failed before their first text, whose prefill node may be the one at fault (afterHandoffs).
 */
import { Clock, Duration, Effect, Result, type Scope } from "effect"
import {
  type CompletionPath,
  complete,
  type EngineClientService,
  EngineError
} from "../../services/engine/EngineClient.ts"
import type { EngineStallService } from "../../services/engine/EngineStall.ts"
import type { FailedRun } from "../../services/engine/FailedCalls.ts"
import { engineFailedCall } from "../../services/grpc/GrpcStatus.ts"
import { background } from "../observability/backgroundFiber.ts"
import { PROBE_TOKENS, type ProbeRequest, type ProbeShape, probeBody } from "./probeShape.ts"

/** A request of the probe that failed, with the rank it went to. */
interface Failed {
  readonly error: EngineError
  readonly rank: number | undefined
  /**
   * A probe's failure: the ranks that gave no answer where others did (a rank that hangs alone); undefined when no
   * request named a rank or none answered (the engine as a whole).
   */
  readonly silent?: ReadonlyArray<number> | undefined
}

/** The engine has no such endpoint (or not for POST): the other one may serve. */
const noEndpoint = ({ error: e }: Failed) =>
  e.reason === "Http" && (e.status === 404 || e.status === 405 || e.status === 501)

const otherPath = (path: CompletionPath): CompletionPath =>
  path === "/v1/completions" ? "/v1/chat/completions" : "/v1/completions"

/**
 * The probe runner of one watchdog, one probe at a time (the caller checks stalled, idle and Ready):
 * - `stalled(now)` while the engine is taken as stalled: one that completes (every request) clears the stall;
 * - `idle(now)` for an engine that has had no call for `idleFor` (engine.idle_probe_after), and
 * - `streamStalled(now)` after a stream stalled, to each data-parallel rank (only where the probe has one request per
 *   rank: a rank that hangs alone stalls its streams while the others complete calls, which would clear the stall);
 *   in these two a request that gets no answer in time takes the engine as stalled (EngineStall.testFailed);
 * - `handoffs(now, run)` after decode legs failed before their first text, calls in flight or not: whether they are
 *   the engine's failures (afterHandoffs).
 * At most once per `idleMs` (engine.stream_idle_timeout), start to start; while stalled, after a test the engine
 * answered with an error (a refused connection, a 5xx: not a wedge), again `errorRetryMs` after it began
 * (engine.liveness_interval): a proxied server back from a restart, or an engine that recovered, is back in traffic
 * within seconds, not a stream_idle_timeout later (a review saw a 3 s restart of an openai_compat server keep its
 * agents out of routing for 5 minutes).
 */
export const stallProbe = (
  client: EngineClientService,
  stall: EngineStallService,
  idleMs: number,
  shape: ProbeShape,
  scope: Scope.Scope,
  idleFor = "0s",
  ready: Effect.Effect<boolean> = Effect.succeed(true),
  /** When a Generate call last completed (epoch ms; the watchdog's tick records it). */
  lastCompletedAt: () => number = () => Number.NEGATIVE_INFINITY,
  errorRetryMs: number = idleMs
) => {
  let inFlight = false
  let nextAt = Number.NEGATIVE_INFINITY
  /** When the test in flight (or the last) began. */
  let startedAt = Number.NEGATIVE_INFINITY
  let lastFailure: string | undefined
  let path: CompletionPath = "/v1/completions"
  const noAnswer = new EngineError({
    reason: "Timeout",
    message: `no answer within ${Duration.format(Duration.millis(idleMs))}`
  })

  const askOne = (on: CompletionPath, r: ProbeRequest) =>
    complete(
      client,
      on,
      probeBody(on, shape, r.fields),
      r.rank === undefined ? undefined : { dataParallelRank: r.rank }
    ).pipe(
      Effect.timeoutOrElse({ duration: Duration.millis(idleMs), orElse: () => Effect.fail(noAnswer) }),
      Effect.mapError((error): Failed => ({ error, rank: r.rank })),
      Effect.result
    )
  // Every request must complete. All are awaited, and no answer comes first among the failures: a rank that answers
  // an error at once must not hide one that hangs.
  const ask = (on: CompletionPath): Effect.Effect<void, Failed> =>
    Effect.flatMap(
      Effect.forEach(shape.requests, (r) => askOne(on, r), { concurrency: "unbounded" }),
      (results) => {
        const failures = results.filter(Result.isFailure).map((r) => r.failure)
        const first = failures.find((f) => f.error.reason === "Timeout") ?? failures[0]
        if (first === undefined) return Effect.void
        const silent = failures.filter((f) => f.error.reason === "Timeout" && f.rank !== undefined)
        if (silent.length > 0 && silent.length < results.length)
          return Effect.fail({ ...first, silent: silent.map((f) => f.rank as number) })
        // every rank silent: the engine's, no rank to name (in the log either)
        return Effect.fail(silent.length === results.length ? { ...first, rank: undefined } : first)
      }
    )
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
    )
  )
  /**
   * A warning per new reason a test failed for (the same one each time would fill the log); none when the engine is no
   * longer Ready: a run ended under the test (a restart, a drain's stop) broke it, which says nothing of the engine.
   */
  const failed = ({ error: e, rank }: Failed, message: string, retryMs = idleMs) =>
    Effect.flatMap(ready, (stillReady) => {
      if (!stillReady || e.message === lastFailure) return Effect.void
      lastFailure = e.message
      // the agent's own shortage (EngineError Local) is not the engine failing the test
      const said =
        e.reason === "Local" ? "the agent could not send the engine a test request: nothing concluded" : message
      return Effect.logWarning(said, {
        error: e.message,
        ...(rank === undefined ? {} : { data_parallel_rank: rank }),
        next_try_in: Duration.format(Duration.millis(retryMs))
      })
    })
  const done = Effect.sync(() => {
    inFlight = false
  })

  /**
   * A rank (or the engine) that gave no answer: the engine is taken as stalled, unless the run ended under the test.
   * A silent rank whose own counters moved meanwhile is at work, its queue holding the test: not hung (a long queue on
   * one rank while another answered read as a hung rank, and a soak's working engine was restarted for it).
   */
  const noAnswerFrom = (f: Failed, sentAfter: string) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      if (!(yield* ready)) return
      if (f.silent === undefined) {
        // calls completed while it waited: the engine works, a queue held the test (it logged unhealthy, and clear
        // at the next completion, for nothing)
        if (lastCompletedAt() >= startedAt) return
        return yield* stall.testFailed({ since: now, sentAfter })
      }
      const busy = yield* Effect.filter(f.silent, (r) => stall.rankMoved(r, startedAt))
      const hung = f.silent.filter((r) => !busy.includes(r))
      if (hung.length > 0) return yield* stall.testFailed({ since: now, sentAfter, ranks: hung })
      yield* Effect.logInfo("data-parallel ranks gave no answer to a test in time, but their counters moved: busy", {
        ranks: busy.join(","),
        sent: sentAfter
      })
    })

  // While stalled: one that completes on every rank clears the stall; one that a rank does not answer also keeps
  // that rank's failure (a call another rank completes later must not clear the stall: EngineStall.onCompleted).
  const whileStalled = request.pipe(
    Effect.matchEffect({
      onSuccess: () =>
        Effect.gen(function* () {
          lastFailure = undefined
          // the stall's end is logged once, by EngineStall, with this as its cause
          yield* stall.completed(
            yield* Clock.currentTimeMillis,
            `the engine completed a test request sent with no call in flight (max_tokens ${PROBE_TOKENS}, ${path}${
              shape.requests.length > 1 ? `, on each of its ${shape.requests.length} data-parallel ranks` : ""
            })`,
            true
          )
        }),
      onFailure: (f) => {
        // an answer, if an error, is no wedge: the next test sooner (see above)
        const answered = f.error.reason !== "Timeout"
        if (answered) nextAt = Math.min(nextAt, startedAt + errorRetryMs)
        return Effect.andThen(
          f.silent !== undefined ? noAnswerFrom(f, "while the engine was stalled with no call") : Effect.void,
          failed(
            f,
            "the engine failed a test request sent with no call in flight: the node stays unhealthy",
            answered ? errorRetryMs : idleMs
          )
        )
      }
    }),
    Effect.ensuring(done)
  )

  // Only no answer at all is a wedge: an error the engine answers with (a 4xx for a request it will not take, a 5xx of
  // a dead core, which liveness sees) or a refused connection says it is not hung, and is logged instead.
  // One that every rank completes ends a stall a hung rank's test began (EngineStall.onCompleted, everyRank): under
  // load the node is never idle, so the stall's own test never runs, and the rank came back.
  const testing = (sentAfter: string) =>
    request.pipe(
      Effect.matchEffect({
        onSuccess: () =>
          Effect.gen(function* () {
            lastFailure = undefined
            if (shape.requests.length > 1)
              yield* stall.completed(
                yield* Clock.currentTimeMillis,
                `each of its ${shape.requests.length} data-parallel ranks completed a test request`,
                true
              )
          }),
        onFailure: (f) =>
          f.error.reason === "Timeout"
            ? noAnswerFrom(f, sentAfter)
            : failed(f, `the engine failed a test request sent ${sentAfter}: not taken as stalled (only no answer is)`)
      }),
      Effect.ensuring(done)
    )
  /**
   * After `run.calls` decode legs in a row from one prefill node failed before their first text (engineWatch.ts): a
   * test the engine completes says their handoffs failed (the prefill node crashed, restarted or drained: its own log
   * and its agent's say why), and they are not counted against this engine; one the engine fails as it fails a call
   * (EngineStatus.ts failsCall: a 5xx but 501 and 503, a broken connection) counts them as its failed calls
   * (EngineStall.callsFailed: the node unhealthy, failing calls), unless a call completed meanwhile. Nothing else
   * concludes: this test goes with calls in flight, so a busy engine's 503 or 429, or a queue that holds it past the
   * idle timeout (long generations), says nothing of the legs; the stall watchdog sees a wedge by its streams.
   */
  const afterHandoffs = (run: FailedRun) => {
    const sent = "after decode legs failed before their first token"
    return request.pipe(
      Effect.matchEffect({
        onSuccess: () =>
          Effect.gen(function* () {
            lastFailure = undefined
            yield* Effect.logInfo(
              `${run.calls} decode legs in a row failed before their first token, and the engine completed a test request of its own: taken as their KV handoffs' failures (see their prefill nodes), not counted toward engine.failed_calls_unhealthy`,
              { last: run.last }
            )
            // on every rank: as any test completed there, it ends a hung rank's stall (`testing`)
            if (shape.requests.length > 1)
              yield* stall.completed(
                yield* Clock.currentTimeMillis,
                `each of its ${shape.requests.length} data-parallel ranks completed a test request`,
                true
              )
          }),
        onFailure: (f) => {
          if (engineFailedCall(f.error) === undefined)
            return failed(f, `the engine did not complete a test request sent ${sent}: nothing concluded`)
          return Effect.andThen(
            failed(f, `the engine failed a test request sent ${sent}: their failures are taken as the engine's`),
            Effect.flatMap(Effect.zip(ready, Clock.currentTimeMillis), ([stillReady, now]) =>
              stillReady && lastCompletedAt() < startedAt ? stall.callsFailed(now, run.calls, run.last) : Effect.void
            )
          )
        }
      }),
      Effect.ensuring(done)
    )
  }
  const whileIdle = testing(`after ${idleFor} without calls (engine.idle_probe_after)`)
  const afterStreamStall = testing("after a stream stalled")

  /** Starts `probe` when none is in flight and the last began `idleMs` ago or more; whether it started. */
  const start = (now: number, probe: Effect.Effect<void>): Effect.Effect<boolean> =>
    Effect.suspend(() => {
      if (inFlight || now < nextAt) return Effect.succeed(false)
      inFlight = true
      startedAt = now
      nextAt = now + idleMs
      // one test: its end (`done`) lets the next start; a defect in it is said (the test concluded nothing)
      const said = background("the engine's test request", "this test concluded nothing; the next one is sent as due", {
        oneShot: true
      })
      return Effect.as(Effect.forkIn(said(probe), scope), true)
    })

  return {
    stalled: (now: number): Effect.Effect<boolean> => start(now, whileStalled),
    /** The next test may start at once, however recently the last began (an engine newly failing calls). */
    soon: (): void => {
      nextAt = Number.NEGATIVE_INFINITY
    },
    idle: (now: number): Effect.Effect<boolean> => start(now, whileIdle),
    /**
     * Decode legs failed before their first text: whether they are the engine's failures (see afterHandoffs). Sooner
     * than the tests' stream_idle_timeout pace: `errorRetryMs` (engine.liveness_interval) after the last test began, so
     * an engine that breaks after a test forgave a run is taken out within that, not minutes later.
     */
    handoffs: (now: number, run: FailedRun): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        if (now >= startedAt + errorRetryMs) nextAt = Math.min(nextAt, now)
        return start(now, afterHandoffs(run))
      }),
    /** Nothing to do (true at once) where the probe has a single request: the stall itself says it all. */
    streamStalled: (now: number): Effect.Effect<boolean> =>
      shape.requests.length > 1 ? start(now, afterStreamStall) : Effect.succeed(true)
  }
}
