// How a simulated engine fails in the middle of a request, in each engine's own wire form: an error event
// in the SSE stream (with or without `data: [DONE]`), older llama.cpp's `error:` field line, a body that just
// ends (mlx-lm), or a reset.
import type * as http from "node:http"
import { DONE, sse } from "./chunks.ts"
import { type SimContext, sendError, sseHeaders } from "./context.ts"
import { ENGINE_DEAD_MESSAGE, engineDead, engineDeadAnswer } from "./engineDeath.ts"
import { errorBody, LLAMA_ERROR_FIELD, legacyVllm } from "./errors.ts"

const MESSAGE = "simulated mid-stream engine failure"

/** vLLM's words for a request its engine finished with finish_reason "error" (a failed KV load, pdLegs.ts). */
export const GENERATION_ERROR = "Internal server error"

/**
 * The error event's object. SGLang reports an engine-side failure as the scheduler's abort with an HTTP status
 * (an out-of-memory, a timeout), sent wrapped with the status's name as its type:
 * `{"error":{"object":"error",...,"type":"INTERNAL_SERVER_ERROR","code":500}}` (sgl-project/sglang
 * python/sglang/srt/entrypoints/openai/serving_chat.py and serving_completions.py: a finish_reason of type abort
 * whose status_code is an HTTPStatus goes to create_streaming_error_response(message, code.name, code.value);
 * serving_base.py wraps it as `json.dumps({"error": error.model_dump()})`). vLLM sends its HTTP error object,
 * which before 0.10.1 (--sim-legacy-errors) it also wrapped (`{"error": ErrorResponse(...).model_dump()}`,
 * vllm/entrypoints/openai/serving_engine.py create_streaming_error_response). llama.cpp: its HTTP error object.
 */
const midStreamError = (ctx: SimContext, message: string): unknown => {
  const { flavor } = ctx.cfg
  if (flavor === "sglang") {
    const flat = errorBody("sglang", 500, message) as Record<string, unknown>
    return { error: { ...flat, type: "INTERNAL_SERVER_ERROR" } }
  }
  if (flavor === "vllm" && ctx.cfg.legacyErrors) return { error: legacyVllm(errorBody("vllm", 500, message)) }
  return errorBody(flavor, 500, message)
}

/**
 * The stream's last bytes after a mid-stream failure. vLLM and SGLang send `data: {"error":...}` then
 * `data: [DONE]` (vllm-project/vllm vllm/entrypoints/openai/completion/serving.py, sgl-project/sglang
 * python/sglang/srt/entrypoints/openai/serving_chat.py); current llama.cpp sends `data: {"error":...}` and
 * closes without [DONE] (ggml-org/llama.cpp tools/server/server-context.cpp, "error received during
 * streaming, terminating stream"); older llama.cpp sent an `error: {...}` field line (the flat
 * code/message/type object) then `data: [DONE]` (tools/server/server.cpp, server_sent_event). mlx-lm has no
 * error event (mlxFailure).
 */
const streamTail = (ctx: SimContext, kind: Injected | "engine_dead" | undefined, message: string): string => {
  const body = sse(JSON.stringify(midStreamError(ctx, message)))
  if (ctx.cfg.flavor !== "llama_cpp") return body + DONE
  return kind === "sse_error_field" ? `error: ${JSON.stringify(LLAMA_ERROR_FIELD(message))}\n\n${DONE}` : body
}

/**
 * mlx-lm generates inside APIHandler.handle_completion with no `except`: an exception that the generation
 * thread hands over (ResponseGenerator.generate, `_inner` re-raises it) escapes do_POST, and Python's
 * socketserver logs it and closes the connection (ml-explore/mlx-lm mlx_lm/server.py). A stream then ends
 * with neither an error event nor `data: [DONE]`; the response is HTTP/1.0, so the client sees the body end
 * cleanly (here: the last chunk of a chunked body). A whole response had its status line and headers only
 * buffered (`_set_completion_headers` without `end_headers`), so nothing at all was sent before the close.
 */
const mlxFailure = (res: http.ServerResponse, streaming: boolean): void => {
  if (streaming) res.end()
  else res.socket?.end()
}

/**
 * SGLang's answer to a request its scheduler finished with FINISH_ABORT(words, HTTPStatus.BAD_REQUEST) before any
 * token (sglangSchedulerBound.ts), its words logged at error level as Req.set_finish_with_abort logs them. A whole
 * answer: TokenizerManager._handle_abort_finish_reason raises ValueError(words), which the OpenAI handler answers
 * 400 BadRequestError as its own refusals (serving_chat.py, serving_completions.py `create_error_response(str(e))`).
 * A stream: the abort is handed on, not raised, so the handler's kick-start of its generator (which turns only a
 * ValueError into a 400) sees a first chunk, and the answer is 200 `text/event-stream` whose first event is the
 * error, typed by the status's name, then `data: [DONE]` (sgl-project/sglang python/sglang/srt/managers/
 * tokenizer_manager.py, python/sglang/srt/entrypoints/openai/serving_chat.py _handle_streaming_request and
 * _generate_chat_stream; serving_completions.py alike). Not modelled: the usage chunk that SGLang sends between the
 * two when the request asked for include_usage.
 */
export const schedulerAbort = (ctx: SimContext, res: http.ServerResponse, words: string, stream: boolean): void => {
  ctx.log(words, { level: "error" })
  if (!stream) return void sendError(ctx, res, 400, words)
  const flat = errorBody("sglang", 400, words) as Record<string, unknown>
  res.writeHead(200, sseHeaders(ctx.cfg.flavor))
  res.end(sse(JSON.stringify({ error: { ...flat, type: "BAD_REQUEST" } })) + DONE)
}

export type Injected = "midstream" | "sse_error_field" | "reset"

/**
 * The fault a request meets: a failed KV load's before its first token (as vLLM's first engine step fails,
 * pdLegs.ts), else --sim-error-kind's after the first token (`at`: the tokens made before it). generate.ts also
 * strikes it at the answer's end, so that an answer with fewer tokens (one, or a stop string at the first) fails too;
 * where the last token travels with the finish (vLLM, SGLang), such an answer's stream shows no token before it.
 * A vLLM engine that dies meanwhile (the `engineDead` fault, engineDeath.ts) fails it at its next token: read on
 * each token, so the planned fault changes as the fault does.
 */
export const plannedFault = (ctx: SimContext, kvLoadFailed: boolean, inject: Injected | undefined) => {
  const planned = kvLoadFailed
    ? { kind: "midstream" as const, at: 0, message: GENERATION_ERROR }
    : { kind: inject, at: inject === undefined ? Number.POSITIVE_INFINITY : 1, message: undefined }
  return {
    get kind(): Injected | "engine_dead" | undefined {
      return engineDead(ctx) ? "engine_dead" : planned.kind
    },
    get at(): number {
      return engineDead(ctx) ? 0 : planned.at
    },
    get message(): string | undefined {
      return engineDead(ctx) ? ENGINE_DEAD_MESSAGE : planned.message
    }
  }
}

/**
 * Mid-stream error or a connection reset, after `done` has settled the request's bookkeeping; `pending`: the
 * stream's chunks not yet written, which go out first.
 */
export const fault = (
  ctx: SimContext,
  res: http.ServerResponse,
  kind: Injected | "engine_dead" | undefined,
  streaming: boolean,
  done: () => void,
  message?: string,
  pending = ""
): void => {
  done()
  if (pending !== "") res.write(pending)
  if (kind === "reset") {
    if (!streaming) res.writeHead(200, { "content-type": "application/json", "content-length": 1000 })
    res.socket?.resetAndDestroy()
    return
  }
  if (ctx.cfg.flavor === "mlx") return void mlxFailure(res, streaming)
  // a dead vLLM engine: a whole answer's EngineDeadError is raised to launcher.py's handler (engineDeath.ts)
  if (kind === "engine_dead" && !streaming) return void engineDeadAnswer(ctx, res)
  if (streaming) return void res.end(streamTail(ctx, kind, message ?? MESSAGE))
  sendError(ctx, res, 500, message ?? "simulated engine failure")
}
