/**
 * Generate: the pure translation between the gRPC contract and the engine's OpenAI API.
 * Owns request validation (with statuses a caller can act on), the input and sampling fields of the
 * OpenAI request body (handoff fields: Handoff.ts; model/stream/stream_options: the EngineClient). Reading
 * the engine's answer back is ChunkReader.ts. No I/O: the gRPC layer runs the engine call (layers/grpc/EngineLegs.ts)
 * and the timing around it (GenerateCall.ts).
 */
import { Schema } from "effect"
import type { GenerateRequest, Sampling } from "../../gen/cgn/agent/v1/agent.ts"
import type { AgentConfig } from "../config/Config.ts"
import type { RequestDialect } from "../engine/Engine.ts"
import type { CompletionPath, JsonObject } from "../engine/EngineClient.ts"
import { requestContext } from "../engine/ServedContext.ts"
import { exactIntegerJson } from "./ExactInteger.ts"
import { quoteInput } from "./StatusMessage.ts"

const MAX_UINT64 = 2n ** 64n - 1n

/**
 * Why the agent refuses a request; GrpcStatus.ts's table gives each its gRPC status and whether another node may
 * take the call (as `cgn-reason`, these names).
 */
export const RejectReasons = ["invalid_argument", "model_not_served", "request_too_large"] as const
export type RejectReason = (typeof RejectReasons)[number]

/** A Generate call the agent refuses (not an engine failure). */
export class GenerateRejected extends Schema.TaggedError<GenerateRejected>()("GenerateRejected", {
  reason: Schema.Literals(RejectReasons),
  message: Schema.String,
  /** The request field at fault, as a proto path (`sampling.top_p`), when there is one. */
  field: Schema.optionalKey(Schema.String)
}) {}

/** What the engine call needs, derived from a valid request (not services/engine's EnginePlan, the launch plan). */
export interface RequestPlan {
  readonly path: CompletionPath
  /**
   * The input and sampling fields, which this module owns. The handoff fields are Handoff's (planLeg), and
   * `model`, `stream`, `stream_options` the EngineClient's (it writes the engine's name for the model).
   */
  readonly body: JsonObject
}

export const CHAT_ROLES: ReadonlySet<string> = new Set(["system", "user", "assistant", "tool", "developer"])
export const MAX_STOP_SEQUENCES = 16

const reject = (reason: RejectReason, message: string, field?: string): GenerateRejected =>
  new GenerateRejected(field === undefined ? { reason, message } : { reason, message, field })

/** UTF-8 length without allocating (the pure module has no Buffer). */
export const utf8Bytes = (s: string): number => {
  let n = 0
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x80) n += 1
    else if (c < 0x800) n += 2
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      n += 4
      i++
    } else n += 3
  }
  return n
}

/** proto `float` arrives as float32 (0.7 -> 0.699999988); send the engine the value the caller wrote. */
const f32 = (v: number): number => Number(v.toPrecision(7))

interface Range {
  readonly field: string
  readonly min: number
  readonly max: number
  readonly minOpen?: boolean
  /** What completes "sampling.x must be ...": "in 0..2". */
  readonly text: string
}
const RANGES: ReadonlyArray<Range & { readonly key: keyof Sampling; readonly body: string }> = [
  { key: "temperature", body: "temperature", field: "sampling.temperature", min: 0, max: 2, text: "in 0..2" },
  { key: "topP", body: "top_p", field: "sampling.top_p", min: 0, max: 1, minOpen: true, text: "in (0, 1]" },
  {
    key: "presencePenalty",
    body: "presence_penalty",
    field: "sampling.presence_penalty",
    min: -2,
    max: 2,
    text: "in -2..2"
  },
  {
    key: "frequencyPenalty",
    body: "frequency_penalty",
    field: "sampling.frequency_penalty",
    min: -2,
    max: 2,
    text: "in -2..2"
  },
  {
    key: "repetitionPenalty",
    body: "repetition_penalty",
    field: "sampling.repetition_penalty",
    min: 0,
    max: Number.POSITIVE_INFINITY,
    minOpen: true,
    text: "> 0 and finite (1 is neutral)"
  }
]

const samplingBody = (
  s: Sampling,
  config: AgentConfig,
  dialect: RequestDialect,
  body: Record<string, unknown>,
  served: number | undefined
): GenerateRejected | undefined => {
  if (s.maxTokens !== undefined) {
    const limit = config.agent.max_tokens_limit
    if (s.maxTokens < 1)
      return reject("invalid_argument", `sampling.max_tokens must be >= 1, got ${s.maxTokens}`, "sampling.max_tokens")
    if (s.maxTokens > limit)
      return reject(
        "invalid_argument",
        `sampling.max_tokens ${s.maxTokens} is above this node's limit of ${limit} ([agent].max_tokens_limit); ask for at most ${limit}`,
        "sampling.max_tokens"
      )
    // The engine's own per-request limit, where it is below the configured one (llama-server's -c split among its
    // slots): the prompt and the output share it, and a prompt is at least one token, so from the whole context up
    // vLLM and SGLang refuse the call (prompt + max_tokens > max_model_len) and llama-server cuts it short with finish
    // "length" (ServedContext.ts).
    const context = requestContext(config.model.max_model_len, served)
    if (context !== undefined && s.maxTokens >= context.tokens)
      return reject(
        "invalid_argument",
        `sampling.max_tokens ${s.maxTokens} leaves no room for the prompt in ${
          context.engine
            ? `the context one request can use on this node, ${context.tokens} tokens, as the engine reports it`
            : `the model's context length ${context.tokens}`
        }; ask for at most ${context.tokens - 1}`,
        "sampling.max_tokens"
      )
    body.max_tokens = s.maxTokens
  }
  for (const r of RANGES) {
    const raw = s[r.key] as number | undefined
    if (raw === undefined) continue
    const v = f32(raw)
    const low = r.minOpen === true ? v <= r.min : v < r.min
    // NaN, and infinity (JSON has none: it would reach the engine as null, read as unset)
    if (!Number.isFinite(v) || low || v > r.max)
      return reject("invalid_argument", `${r.field} must be ${r.text}, got ${v}`, r.field)
    const own = dialect.ranges?.[r.body]
    if (own !== undefined && (v < own.min || v > own.max))
      return reject(
        "invalid_argument",
        `${r.field} must be ${own.text} on ${config.engine.kind}: ${own.why}; got ${v}`,
        r.field
      )
    body[dialect.fieldNames?.[r.body] ?? r.body] = v
  }
  if (s.topK !== undefined) {
    if (s.topK !== -1 && s.topK < 1)
      return reject("invalid_argument", `sampling.top_k must be -1 (off) or >= 1, got ${s.topK}`, "sampling.top_k")
    body.top_k = s.topK === -1 ? (dialect.topKOff ?? -1) : s.topK
  }
  if (s.stop.length > 0) {
    if (s.stop.length > MAX_STOP_SEQUENCES)
      return reject(
        "invalid_argument",
        `sampling.stop has ${s.stop.length} sequences; at most ${MAX_STOP_SEQUENCES} are allowed`,
        "sampling.stop"
      )
    const empty = s.stop.indexOf("")
    if (empty >= 0)
      return reject(
        "invalid_argument",
        `sampling.stop[${empty}] is empty; stop sequences must be non-empty`,
        "sampling.stop"
      )
    body.stop = [...s.stop]
  }
  if (s.seed !== undefined) {
    // A uint64 decoded as a string (jstype = JS_STRING): the whole range, sent to the engine digit for digit.
    // vLLM bounds it to int64 (protocol.py `seed: Field(ge=_LONG_INFO.min, le=_LONG_INFO.max)`) and answers 400
    // above that, which reaches the caller as the engine's own refusal.
    const seed = /^\d{1,20}$/.test(s.seed) ? BigInt(s.seed) : undefined
    if (seed === undefined || seed > MAX_UINT64)
      return reject(
        "invalid_argument",
        `sampling.seed must be an integer in [0, 2^64-1], got ${/^\d{1,64}$/.test(s.seed) ? s.seed : quoteInput(s.seed)}`,
        "sampling.seed"
      )
    const max = dialect.maxSeed
    if (max !== undefined && seed > max.value)
      return reject(
        "invalid_argument",
        `sampling.seed must be in [0, ${max.value}] on ${config.engine.kind}: ${max.why}; got ${s.seed}`,
        "sampling.seed"
      )
    body.seed = exactIntegerJson(seed)
  }
  return undefined
}

/**
 * A request id goes to the engine as the X-Request-Id header: printable ASCII only (no line break to inject), and no
 * space at either end, which HTTP trims from a header's value (RFC 9110 5.5): the engine would log another id than
 * the caller's, the final message and the logs.
 */
const REQUEST_ID = /^(?:[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?)?$/

/**
 * Validates a request against this node and builds the engine call, or says precisely what is wrong. `dialect` is
 * the engine backend's spelling of the request (`capabilities.requestDialect`); `servedContext` the context one request can
 * use as the engine reported it (ServedContext.ts), undefined while unknown.
 */
export const planRequest = (
  req: GenerateRequest,
  config: AgentConfig,
  dialect: RequestDialect = {},
  servedContext?: number
): RequestPlan | GenerateRejected => {
  const served = config.model.served_name
  // The caller's values are quoted shortened (StatusMessage.ts quoteInput): echoed whole, a 120k-character model
  // name made a status no client's header limit holds.
  if (req.model !== "" && req.model !== served)
    return reject(
      "model_not_served",
      `model ${quoteInput(req.model)} is not served here; this node serves ${quoteInput(served)}`,
      "model"
    )
  if (!REQUEST_ID.test(req.requestId))
    return reject(
      "invalid_argument",
      `request_id must be at most 256 printable ASCII characters, no space at either end (the engine gets it as X-Request-Id); got ${quoteInput(req.requestId)}`,
      "request_id"
    )
  const maxBytes = config.agent.max_request_bytes
  const body: Record<string, unknown> = {}
  let path: CompletionPath
  let bytes = 0
  if (req.chat !== undefined) {
    const messages = req.chat.messages
    if (messages.length === 0)
      return reject("invalid_argument", "chat.messages is empty: give at least one message", "chat.messages")
    const out = new Array<{ role: string; content: string }>(messages.length)
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!
      if (!CHAT_ROLES.has(m.role))
        return reject(
          "invalid_argument",
          `chat.messages[${i}].role ${quoteInput(m.role)} is not one of ${[...CHAT_ROLES].join(", ")}`,
          `chat.messages[${i}].role`
        )
      bytes += utf8Bytes(m.content)
      out[i] = { role: m.role, content: m.content }
    }
    path = "/v1/chat/completions"
    body.messages = out
  } else if (req.prompt !== undefined) {
    if (req.prompt === "") return reject("invalid_argument", "prompt is empty: give a non-empty prompt", "prompt")
    bytes = utf8Bytes(req.prompt)
    path = "/v1/completions"
    body.prompt = req.prompt
  } else {
    return reject("invalid_argument", "no input: set either `chat` (messages) or `prompt`", "input")
  }
  if (bytes > maxBytes)
    return reject(
      "request_too_large",
      `input is ${bytes} bytes, above this node's limit of ${maxBytes} bytes ([agent].max_request_bytes); shorten the prompt`,
      req.chat !== undefined ? "chat" : "prompt"
    )
  if (req.sampling !== undefined) {
    const bad = samplingBody(req.sampling, config, dialect, body, servedContext)
    if (bad !== undefined) return bad
  }
  return { path, body }
}
