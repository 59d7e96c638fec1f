// Error bodies of each engine flavor (pure), as the newest upstream sources write them:
// - vLLM >= 0.10.1 (vllm-project/vllm PR #22099): nested {"error":{message,type,param,code}} (ErrorResponse /
//   ErrorInfo, vllm/entrypoints/openai/protocol.py; OpenAIServing.create_error_response), the same object after
//   `data: ` mid-stream (create_streaming_error_response dumps it as is). Before 0.10.1 the HTTP body was flat
//   {"object":"error",message,type,param,code} and the stream wrapped it: {"error":{"object":"error",...}}
//   (--sim-legacy-errors, legacyVllm below).
// - SGLang: flat {"object":"error",message,type,param,code} over HTTP (sgl-project/sglang
//   python/sglang/srt/entrypoints/openai/serving_base.py create_error_response, still flat at v0.5.16: issue
//   #33504; PR #33534, open, would nest it as {"error":{"object":"error",...}}), wrapped {"error":{...}} in a
//   stream (create_streaming_error_response).
// - llama.cpp: {"error":{code,message,type}} (ggml-org/llama.cpp tools/server/utils.hpp format_error_response;
//   the real llama-server of test/real is the reference), mid-stream `data: {"error":{...}}`.
// - mlx-lm: {"error":"..."} (ml-explore/mlx-lm mlx_lm/server.py, handle_completion).
import type { Flavor } from "./simConfig.ts"

const VLLM_TYPES: Record<number, string> = {
  400: "BadRequestError",
  404: "NotFoundError",
  411: "BadRequestError",
  429: "RateLimitError",
  500: "InternalServerError",
  503: "ServiceUnavailableError"
}

const LLAMA_TYPES: Record<number, string> = {
  400: "invalid_request_error",
  404: "not_found_error",
  429: "unavailable_error",
  500: "server_error",
  501: "not_supported_error",
  503: "unavailable_error"
}

/** The JSON error object a flavor sends with HTTP `status` (also used mid-stream after `data: `). */
export const errorBody = (flavor: Flavor, status: number, message: string, param: string | null = null): unknown => {
  switch (flavor) {
    case "vllm":
      return { error: { message, type: VLLM_TYPES[status] ?? "InternalServerError", param, code: status } }
    case "sglang":
      return { object: "error", message, type: VLLM_TYPES[status] ?? "InternalServerError", param, code: status }
    case "llama_cpp":
      return { error: { code: status, message, type: LLAMA_TYPES[status] ?? "server_error" } }
    case "mlx":
      return { error: message }
  }
}

/**
 * A body that is not JSON. llama-server parses with nlohmann::json inside its generic exception handler, so the
 * parse error comes back as 500 `server_error` (tools/server/server-http.cpp ex_wrapper; seen on the real server);
 * the Python servers answer 400.
 */
export const invalidJson = (
  flavor: Flavor,
  detail: string,
  raw: string
): { readonly status: number; readonly message: string } => {
  // mlx-lm words its 400 itself (do_POST: `{"error": f"Invalid JSON in request body: {e}"}`).
  if (flavor === "mlx") return { status: 400, message: `Invalid JSON in request body: ${detail}` }
  if (flavor !== "llama_cpp") return { status: 400, message: `Invalid JSON body: ${detail}` }
  // nlohmann's own words for an empty body and for one of whitespace alone (its lexer counts a line per \n and the
  // end of input as a character of the last line: measured); other syntax errors keep its prefix and JSON.parse's
  // detail.
  const lines = raw.split("\n")
  const text =
    raw === ""
      ? "parse error at line 1, column 1: attempting to parse an empty input; check that your input string or stream contains the expected JSON"
      : /^[ \t\n\r]+$/.test(raw)
        ? `parse error at line ${lines.length}, column ${(lines.at(-1) ?? "").length + 1}: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal`
        : `parse error: ${detail}`
  return { status: 500, message: `[json.exception.parse_error.101] ${text}` }
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

/**
 * A vLLM body as vLLM before 0.10.1 sent it: ErrorResponse's fields flat, `object` first, in its field order
 * (object, message, type, param, code); a body that is not nested is returned as is.
 */
export const legacyVllm = (body: unknown): unknown => {
  const e = isRecord(body) ? body.error : undefined
  if (!isRecord(e)) return body
  return { object: "error", message: e.message, type: e.type, param: e.param ?? null, code: e.code }
}

/** What older llama.cpp put on its `error:` SSE line: format_error_response's flat object. */
export const LLAMA_ERROR_FIELD = (message: string) => ({ code: 500, message, type: "server_error" })

/** llama.cpp's answer to everything while the model loads (tools/server/server-http.cpp middleware_server_state). */
export const LLAMA_LOADING = { error: { message: "Loading model", type: "unavailable_error", code: 503 } }

/** llama-server's 501 for /metrics without --metrics (tools/server/server-context.cpp, the metrics handler). */
export const LLAMA_NO_METRICS = "This server does not support metrics endpoint. Start it with `--metrics`"

/** llama.cpp's 404 for a path (or method) it has no route for (server-http.cpp, the error handler). */
export const LLAMA_NOT_FOUND = { error: { message: "File Not Found", type: "not_found_error", code: 404 } }

/** Python's repr() of a str: single quotes unless the text has one and no double quote. */
const pyRepr = (s: string): string => {
  const escaped = s.replaceAll("\\", "\\\\").replaceAll("\n", "\\n")
  if (s.includes("'") && !s.includes('"')) return `"${escaped}"`
  return `'${escaped.replaceAll("'", "\\'")}'`
}

/**
 * vLLM's 400 for a request its pydantic model rejects (a `model_validator` raising VLLMValidationError):
 * FastAPI's RequestValidationError as vLLM's handler renders it, with type "Bad Request" (the HTTP phrase,
 * not BadRequestError), `param` from the error and a message listing the errors, the body summarised as
 * `<dict of N items>` (vllm-project/vllm vllm/entrypoints/serve/exception_handling/handlers/validation.py
 * validation_exception_handler; VLLMValidationError.__str__ in vllm/exceptions.py adds `(parameter=...)`).
 * A model-level validator's error sits at loc ('body',), which the handler prints as 'body'.
 */
export const vllmValidationError = (text: string, param: string, bodyKeys: number): unknown => {
  const detail =
    `{'type': 'value_error', 'loc': 'body', 'msg': ${pyRepr(`Value error, ${text} (parameter=${param})`)}, ` +
    `'input': '<dict of ${bodyKeys} items>', 'ctx': {'error': VLLMValidationError(${pyRepr(text)})}}`
  return { error: { message: `1 validation error:\n  ${detail}`, type: "Bad Request", param, code: 400 } }
}
