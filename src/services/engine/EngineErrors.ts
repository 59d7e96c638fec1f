/**
 * EngineErrors: every engine's error body, read into one EngineError, the engine's words in it scrubbed of the run's
 * secrets (`engineWords`). Pure, no I/O.
 * Knows the shapes: vLLM >= 0.10.1 nested `{"error":{message,type,param,code}}`, older vLLM and SGLang
 * flat `{"object":"error",message,type,param,code}` (vllm/entrypoints/openai/protocol.py ErrorResponse,
 * python/sglang/srt/entrypoints/openai/protocol.py), which their streams (and a nested SGLang body, as
 * sgl-project/sglang PR #33534 would send it) wrap as `{"error":{"object":"error",...}}`, where SGLang's type may
 * be a status name or number ("INTERNAL_SERVER_ERROR", "503") and the code is the status; llama.cpp
 * `{"error":{code,message,type}}` (tools/server/utils.hpp format_error_response), mlx-lm `{"error":"..."}`
 * (mlx_lm/server.py), FastAPI `{"detail":...}`, and bodies that are not JSON at all.
 */
import { EngineError, isJsonObject } from "./EngineClient.ts"
import { lineRedactor, type Redactor } from "./LineRedactor.ts"

/** Scrubs no secret: for callers that hold none (tests; what an engine's answer says where no key is sent). */
export const NO_SECRETS: Redactor = lineRedactor([])

/** The engine's own words, whatever shape they came in. */
export interface ErrorDetail {
  readonly message: string
  readonly type?: string
  /** The body's `code`: a number (vLLM, SGLang, llama.cpp put the HTTP status there) or a string (OpenAI). */
  readonly code?: number | string
}

const MAX_TEXT = 500
/**
 * An engine's error type is a word ("BadRequestError", "INTERNAL_SERVER_ERROR"): cut shorter than its message, so a
 * long one does not push the message out of a status bounded to 1 KiB (services/grpc/StatusMessage.ts).
 */
const MAX_TYPE = 64

const str = (v: unknown): string | undefined => (typeof v === "string" && v.length > 0 ? v : undefined)

const code = (v: unknown): number | string | undefined => {
  if (typeof v === "number" && Number.isFinite(v)) return v
  if (typeof v === "string" && v.length > 0) return /^\d+$/.test(v) ? Number(v) : v
  return undefined
}

/**
 * The engine's words as an error carries them on, the one place they pass (every function below, and the layer's
 * quotes of an answer that is no error body: layers/engine/streamExchange.ts, EngineClient.ts): scrubbed of the run's
 * secrets by `redact` (LineRedactor.ts, built once per client from its plan: engine.api_key, the secrets of the
 * engine's environment and arguments; a hostile or echoing engine answers "Incorrect API key provided: <key>"), then
 * bounded to `max` characters, since they become a gRPC status message, which a caller's header limit must hold.
 * Scrubbed before the cut (Redactor.head): a secret the cut falls inside is replaced whole, not shown up to the cut.
 */
export const engineWords = (text: string, max: number, redact: Redactor): string =>
  text.length > max ? `${redact.head(text, max)}…` : redact(text)

const detail = (message: string, type: unknown, c: unknown, redact: Redactor): ErrorDetail => {
  const given = str(type)
  const t = given === undefined ? undefined : engineWords(given, MAX_TYPE, redact)
  const raw = code(c)
  const k = typeof raw === "string" ? redact(raw) : raw
  return {
    message: engineWords(message, MAX_TEXT, redact),
    ...(t === undefined ? {} : { type: t }),
    ...(k === undefined ? {} : { code: k })
  }
}

/** FastAPI validation errors: `[{"loc":[...],"msg":"...","type":"..."}]`. */
const fastApiDetail = (d: unknown): string | undefined => {
  if (typeof d === "string") return d
  if (!Array.isArray(d)) return undefined
  const msgs = d.flatMap((e) => {
    if (!isJsonObject(e)) return []
    const msg = str(e.msg)
    if (msg === undefined) return []
    const loc = Array.isArray(e.loc) ? e.loc.join(".") : undefined
    return [loc === undefined ? msg : `${loc}: ${msg}`]
  })
  return msgs.length > 0 ? msgs.join("; ") : undefined
}

/** The error inside a parsed JSON value, or undefined when it carries none; scrubbed by `redact` (engineWords). */
export const errorDetailOf = (value: unknown, redact: Redactor): ErrorDetail | undefined => {
  if (!isJsonObject(value)) return undefined
  const e = value.error
  if (typeof e === "string") return detail(e, undefined, undefined, redact)
  if (isJsonObject(e)) {
    const message = str(e.message) ?? str(e.msg) ?? str(e.detail) ?? JSON.stringify(e)
    return detail(message, e.type, e.code, redact)
  }
  if (value.object === "error") return detail(str(value.message) ?? "engine error", value.type, value.code, redact)
  if ("detail" in value) {
    const msg = fastApiDetail(value.detail)
    if (msg !== undefined) return detail(msg, undefined, undefined, redact)
  }
  return undefined
}

/** Cheap test for the chunk loop: does this SSE data object carry an error instead of a completion? */
export const isErrorChunk = (obj: Readonly<Record<string, unknown>>): boolean =>
  obj.error !== undefined || obj.object === "error"

/** The engine's words from a raw body: JSON in any known shape, else the text itself; scrubbed by `redact`. */
export const errorDetailOfBody = (body: string, status: number | undefined, redact: Redactor): ErrorDetail => {
  const trimmed = body.trim()
  if (trimmed.startsWith("{")) {
    try {
      const d = errorDetailOf(JSON.parse(trimmed), redact)
      if (d !== undefined) return d
    } catch {
      // not JSON after all: fall through to the text
    }
  }
  if (trimmed.length === 0) return { message: status === undefined ? "empty error body" : `HTTP ${status}` }
  return { message: engineWords(trimmed, MAX_TEXT, redact) }
}

const codeFields = (d: ErrorDetail, status: number | undefined) => {
  const fields: { status?: number; engineType?: string; engineCode?: string } = {}
  if (status !== undefined) fields.status = status
  else if (typeof d.code === "number") fields.status = d.code
  if (d.type !== undefined) fields.engineType = d.type
  if (d.code !== undefined && d.code !== fields.status) fields.engineCode = String(d.code)
  return fields
}

/** `e` marked as an output fault when its message begins as one of the engine's (`capabilities.outputFaults`). */
export const markOutputFault = (e: EngineError, prefixes: ReadonlyArray<string>): EngineError =>
  e.reason !== "Http" && e.reason !== "Stream"
    ? e
    : prefixes.some((p) => e.message.startsWith(p))
      ? new EngineError({
          reason: e.reason,
          message: e.message,
          ...(e.status === undefined ? {} : { status: e.status }),
          ...(e.engineType === undefined ? {} : { engineType: e.engineType }),
          ...(e.engineCode === undefined ? {} : { engineCode: e.engineCode }),
          fault: "output"
        })
      : e

/** An HTTP error status with its body. */
export const httpError = (status: number, body: string, redact: Redactor): EngineError => {
  const d = errorDetailOfBody(body, status, redact)
  return new EngineError({ reason: "Http", message: d.message, ...codeFields(d, status) })
}

/** A mid-stream error object (`data: {"error":...}`); status is the object's numeric code, if any. */
export const streamError = (obj: unknown, redact: Redactor): EngineError => {
  const d = errorDetailOf(obj, redact) ?? { message: "engine sent an error object" }
  return new EngineError({ reason: "Stream", message: d.message, ...codeFields(d, undefined) })
}

/**
 * An SSE error event: an `error:` field line (older llama.cpp: the flat `{"code","message","type"}` of
 * tools/server/utils.hpp `format_error_response`, or a wrapped `{"error":{...}}`) or an `event: error` whose
 * data is the error. JSON in any known shape, else the text itself.
 */
export const sseErrorEvent = (text: string, redact: Redactor): EngineError => {
  let d: ErrorDetail | undefined
  try {
    const v: unknown = JSON.parse(text)
    d = errorDetailOf(v, redact)
    if (d === undefined && isJsonObject(v) && str(v.message) !== undefined)
      d = detail(str(v.message)!, v.type, v.code, redact)
  } catch {
    // not JSON: the text is the message
  }
  d ??= errorDetailOfBody(text, undefined, redact)
  return new EngineError({ reason: "Stream", message: d.message, ...codeFields(d, undefined) })
}
