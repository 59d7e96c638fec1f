// How a simulated engine fails in the middle of a request, in each engine's own wire form: an error event
// in the SSE stream (with or without `data: [DONE]`), older llama.cpp's `error:` field line, or a reset.
import type * as http from "node:http"
import { DONE, sse } from "./chunks.ts"
import { type SimContext, sendError } from "./context.ts"
import { errorBody, LLAMA_ERROR_FIELD } from "./errors.ts"

/**
 * Mid-stream error or a connection reset. vLLM and SGLang send `data: {"error":...}` then `data: [DONE]`
 * (vllm/entrypoints/openai/serving_chat.py, python/sglang/srt/entrypoints/openai/serving_chat.py); current
 * llama.cpp sends `data: {"error":...}` and closes without [DONE]; older llama.cpp sent an `error: {...}` field
 * line (the flat code/message/type object) then `data: [DONE]` (tools/server/server.cpp, server_sent_event).
 */
export const fault = (
  ctx: SimContext,
  res: http.ServerResponse,
  kind: "midstream" | "sse_error_field" | "reset" | undefined,
  streaming: boolean,
  done: () => void
): void => {
  done()
  if (kind === "reset") {
    if (!streaming) res.writeHead(200, { "content-type": "application/json", "content-length": 1000 })
    res.socket?.resetAndDestroy()
    return
  }
  const message = "simulated mid-stream engine failure"
  const body = errorBody(ctx.cfg.flavor, 500, message)
  if (streaming) {
    // llama-server ends the stream on an error event without `data: [DONE]`
    // (tools/server/server-context.cpp, "error received during streaming, terminating stream"); older builds
    // sent an SSE `error:` field line, then `data: [DONE]`.
    if (ctx.cfg.flavor !== "llama_cpp") res.end(sse(JSON.stringify(body)) + DONE)
    else if (kind === "sse_error_field") res.end(`error: ${JSON.stringify(LLAMA_ERROR_FIELD(message))}\n\n${DONE}`)
    else res.end(sse(JSON.stringify(body)))
    return
  }
  sendError(ctx, res, 500, "simulated engine failure")
}
