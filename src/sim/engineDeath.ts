// vLLM's engine core dead under its API server (the `engineDead` fault, POST /sim/faults), as the API server answers
// it. Sources, vllm-project/vllm:
// - vllm/entrypoints/openai/chat_completion/serving.py and completion/serving.py (earlier serving_chat.py,
//   serving_completion.py): once the model name is checked, `if self.engine_client.errored: raise
//   self.engine_client.dead_error`, before a stream's 200 goes out; a request in flight gets the EngineDeadError
//   from its output queue: a stream as an error event (create_streaming_error_response, type InternalServerError,
//   code 500) then `data: [DONE]`, a whole answer raised.
// - vllm/entrypoints/launcher.py `_add_shutdown_handlers`: a raised EngineDeadError/EngineGenerateError is answered
//   `Response(status_code=500)` (no body) after `terminate_if_errored`, which sets uvicorn's `server.should_exit`
//   unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH; `watchdog_loop` does the same every VLLM_WATCHDOG_TIME_S = 5.0 s (the
//   path of a stream, whose error is not raised).
// - serve_http: should_exit ends `server.serve()` normally, so `run_server` returns and the process exits 0 after
//   uvicorn's shutdown (connections closed once their answers are done).
// - vllm/entrypoints/serve/instrumentator/health.py: /health answers 503 on EngineDeadError (server.ts).
// SGLang, llama.cpp and mlx-lm have no such state in the simulator (their engines run in the server's process, or
// die with it), so the fault is vLLM's alone.
import type * as http from "node:http"
import type { SimContext } from "./context.ts"
import { type GenRequest, isInvalid } from "./request.ts"
import type { Invalid } from "./requestChecks.ts"

/** EngineDeadError's words (vllm/v1/engine/exceptions.py ENGINE_DEAD_MESSAGE). */
export const ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."

/** launcher.py watchdog_loop: VLLM_WATCHDOG_TIME_S = 5.0. */
export const VLLM_WATCHDOG_MS = 5_000

/** vllm/envs.py: `bool(int(os.getenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0")))`. */
export const keepAliveOnEngineDeath = (env: Record<string, string | undefined>): boolean => {
  const n = Number(env.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH?.trim() ?? "0")
  return Number.isInteger(n) && n !== 0
}

/** Whether the engine core is dead (vLLM only: the fault means nothing to the other flavors). */
export const engineDead = (ctx: SimContext): boolean => ctx.cfg.flavor === "vllm" && ctx.faults.engineDead

/** launcher.py's answer to a raised EngineDeadError: a bare 500, after terminate_if_errored. */
export const engineDeadAnswer = (ctx: SimContext, res: http.ServerResponse): void => {
  ctx.engineErrored()
  res.writeHead(500, { "content-length": 0 })
  res.end()
}

/**
 * A new request to a dead engine: its handler raises after the model check, so a model it does not serve is still
 * 404 and anything else 500. (The body's own pydantic refusals come first upstream; the simulator does not tell them
 * apart from the handler's, and answers them 500 too.) Whether it answered.
 */
export const deadEngineRefusal = (ctx: SimContext, parsed: GenRequest | Invalid, res: http.ServerResponse): boolean => {
  if (!engineDead(ctx) || (isInvalid(parsed) && parsed.status === 404)) return false
  engineDeadAnswer(ctx, res)
  return true
}

/**
 * vLLM's watchdog and terminate_if_errored: unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, a dead engine ends the server
 * at the next watchdog tick or at the first request its death failed, whichever comes first: the listener closes,
 * each connection once its answer is done, and the process exits 0 (`exit`).
 */
export const startVllmWatchdog = (
  ctx: SimContext,
  server: http.Server,
  env: Record<string, string | undefined>,
  exit: (code: number, reason: string) => void
): void => {
  if (ctx.cfg.flavor !== "vllm") return
  const keep = keepAliveOnEngineDeath(env)
  let exiting = false
  const terminateIfErrored = () => {
    if (keep || exiting || !ctx.faults.engineDead) return
    exiting = true
    // uvicorn's Server.shutdown after should_exit, in its words
    ctx.log("Shutting down")
    server.close(() => {
      ctx.log("Waiting for application shutdown.")
      ctx.log("Application shutdown complete.")
      ctx.log(`Finished server process [${process.pid}]`)
      exit(0, "engine dead: server.should_exit (vLLM terminate_if_errored)")
    })
    // uvicorn closes each connection once its answer is done (HttpToolsProtocol.shutdown: keep_alive off)
    server.closeIdleConnections()
    setInterval(() => server.closeIdleConnections(), 50).unref()
  }
  ctx.engineErrored = terminateIfErrored
  setInterval(terminateIfErrored, VLLM_WATCHDOG_MS).unref()
}
