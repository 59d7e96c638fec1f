// The checks llama-server runs on a chat request beyond its messages' shape (pure), in its order, so the llama_cpp
// flavor refuses what the real server refuses on /v1/chat/completions and /apply-template (both go through
// oaicompat_chat_params_parse, tools/server/server-common.cpp), before any field of the schema (server-schema.cpp)
// is read. Sources, ggml-org/llama.cpp: server-common.cpp oaicompat_chat_params_parse; common/chat.cpp
// common_chat_msgs_parse_oaicompat, common_chat_tools_parse_oaicompat, common_chat_tool_choice_parse_oaicompat,
// common_chat_continuation_parse, common_reasoning_format_from_name, common_chat_templates_apply. A
// std::invalid_argument is answered 400, any other exception (nlohmann's type errors, runtime_error) 500
// (tools/server/server.cpp ex_wrapper). Measured against the real binary by test/real/sim-differential-9.test.ts.
import { reasoningFormat, typeError, typeName } from "./llamaFields.ts"
import { jsonSchemaError } from "./llamaJsonSchema.ts"
import type { LlamaInvalid } from "./llamaRequest.ts"

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

/** nlohmann's range-for: an array's elements, an object's values, a plain value once, null none. */
const items = (v: unknown): Array<unknown> =>
  Array.isArray(v) ? v : isObject(v) ? Object.values(v) : v === null || v === undefined ? [] : [v]

/** json_value(body, key, default): the value where present, not null and of the default's type, else the default. */
const valueOr = <T>(b: unknown, key: string, fallback: T, is: (v: unknown) => v is T): T => {
  const v = isObject(b) ? b[key] : undefined
  return v !== undefined && v !== null && is(v) ? v : fallback
}
const isString = (v: unknown): v is string => typeof v === "string"
const isBool = (v: unknown): v is boolean => typeof v === "boolean"
const isAny = (v: unknown): v is unknown => true

/** get<std::string>() of a key an object holds: nlohmann's type error, or undefined where it converts. */
const notString = (v: unknown): string | undefined => (typeof v === "string" ? undefined : typeError("string", v))

/**
 * Before the messages are looked at: a json_schema beside a non-empty grammar (a runtime_error: 500), then
 * response_format's type. Also the json_schema the chat template gets: the request's, or response_format's schema.
 */
export const chatEarlyChecks = (b: Record<string, unknown>): LlamaInvalid | { readonly schema: unknown } => {
  let schema = valueOr(b, "json_schema", null, isAny)
  if (schema !== null && valueOr(b, "grammar", "", isString) !== "")
    return { status: 500, message: "Cannot use both json_schema and grammar" }
  if ("response_format" in b) {
    const rf = valueOr(b, "response_format", {}, isAny)
    const type = valueOr(rf, "type", "", isString)
    const empty = schema === null || (isObject(schema) && Object.keys(schema).length === 0)
    if (type === "json_object") {
      if ((isObject(rf) && "schema" in rf) || empty) schema = valueOr(rf, "schema", {}, isAny)
    } else if (type === "json_schema") {
      schema = valueOr(valueOr(rf, "json_schema", {}, isAny), "schema", {}, isAny)
    } else if (type !== "" && type !== "text") {
      const message = `response_format type must be one of "text" or "json_object", but got: ${type}`
      return { status: 400, message }
    }
  }
  return { schema }
}

/**
 * One message's fields after its content, as common_chat_msgs_parse_oaicompat reads them: each tool call (its type
 * "function", its function's name a string, its arguments present, its id a string), then reasoning_content, name
 * and tool_call_id as strings. The error (wrapped by the caller as "Failed to parse messages: ..."), or the number
 * of tool calls.
 */
export const messageExtras = (m: Record<string, unknown>): { readonly error: string } | number => {
  let calls = 0
  for (const tc of "tool_calls" in m ? items(m.tool_calls) : []) {
    const dump = JSON.stringify(tc)
    const o = isObject(tc) ? tc : {}
    if (!("type" in o)) return { error: `Missing tool call type: ${dump}` }
    if (o.type !== "function") return { error: `Unsupported tool call type: ${dump}` }
    if (!("function" in o)) return { error: `Missing tool call function: ${dump}` }
    const fc = o.function
    if (!isObject(fc) || !("name" in fc)) return { error: `Missing tool call name: ${dump}` }
    const bad =
      notString(fc.name) ??
      ("arguments" in fc ? undefined : "[json.exception.out_of_range.403] key 'arguments' not found") ??
      ("id" in o ? notString(o.id) : undefined)
    if (bad !== undefined) return { error: bad }
    calls++
  }
  for (const key of ["reasoning_content", "name", "tool_call_id"]) {
    const bad = key in m ? notString(m[key]) : undefined
    if (bad !== undefined) return { error: bad }
  }
  return calls
}

/** common_chat_tools_parse_oaicompat: the first error, or the number of tools. */
const toolsError = (tools: unknown): string | number => {
  if (tools === null) return 0
  if (!Array.isArray(tools)) return `Expected 'tools' to be an array, got ${JSON.stringify(tools)}`
  for (const tool of tools) {
    const o = isObject(tool) ? tool : {}
    if (!("type" in o)) return `Missing tool type: ${JSON.stringify(tool)}`
    if (o.type !== "function") return `Unsupported tool type: ${JSON.stringify(tool)}`
    if (!("function" in o)) return `Missing tool function: ${JSON.stringify(tool)}`
    const f = o.function
    if (!isObject(f)) return `[json.exception.type_error.304] cannot use at() with ${typeName(f)}`
    if (!("name" in f)) return "[json.exception.out_of_range.403] key 'name' not found"
    // name, then function.value("description", ""): a description that is there must be a string
    const bad = notString(f.name) ?? ("description" in f ? notString(f.description) : undefined)
    if (bad !== undefined) return bad
  }
  return tools.length
}

const TOOL_CHOICES = ["auto", "none", "required"]

/** What the late checks need of the messages: how many, the last's role and its tool calls, the one before's role. */
export interface ChatTail {
  readonly count: number
  readonly lastRole: unknown
  readonly lastCalls: number
  readonly beforeRole: unknown
}

/**
 * After the messages parse: the tools (500), tool_choice, two trailing assistant messages, continue_final_message
 * against add_generation_prompt, continuing a message with tool calls, reasoning_format (500), a grammar beside
 * tools, chat_template_kwargs' enable_thinking, the json_schema the template converts (a non-empty object: a
 * converter error fails the parser's generation, 400), then `logprobs` with tools in a stream.
 */
export const chatLateChecks = (
  b: Record<string, unknown>,
  tail: ChatTail,
  schema: unknown
): LlamaInvalid | undefined => {
  const tools = valueOr(b, "tools", null, isAny)
  const nTools = toolsError(tools)
  if (typeof nTools === "string")
    return { status: 500, message: `Failed to parse tools: ${nTools}; tools = ${JSON.stringify(tools, null, 2)}` }
  const toolChoice = valueOr(b, "tool_choice", "auto", isString)
  if (!TOOL_CHOICES.includes(toolChoice)) return { status: 400, message: `Invalid tool_choice: ${toolChoice}` }
  // continue_final_message: true, "content" or "reasoning_content" continue; anything else does not
  const cfm = b.continue_final_message
  let continues = cfm === true || cfm === "content" || cfm === "reasoning_content"
  let addGenerationPrompt = valueOr(b, "add_generation_prompt", true, isBool)
  // --prefill-assistant (on by default) continues a trailing assistant message, but not two
  if (!continues && tail.count > 0 && tail.lastRole === "assistant") {
    if (tail.count >= 2 && tail.beforeRole === "assistant")
      return { status: 400, message: "Cannot have 2 or more assistant messages at the end of the list." }
    continues = true
    addGenerationPrompt = false
  }
  if (continues && addGenerationPrompt)
    return { status: 400, message: "Cannot set both add_generation_prompt and continue_final_message to true." }
  if (continues && tail.lastRole === "assistant" && tail.lastCalls > 0)
    return { status: 400, message: "Cannot continue an assistant message that contains tool calls." }
  if ("reasoning_format" in b) {
    const bad = reasoningFormat(b, "reasoning_format", new Map())
    if (bad !== undefined) return { status: 500, message: bad }
  }
  if (nTools > 0 && toolChoice !== "none" && "grammar" in b)
    return { status: 400, message: "Cannot use custom grammar constraints with tools." }
  const kwargs = valueOr(b, "chat_template_kwargs", {}, isAny)
  if (isObject(kwargs) && typeof kwargs.enable_thinking === "string")
    return { status: 400, message: 'invalid type for "enable_thinking" (expected boolean, got string)' }
  const converted = isObject(schema) && Object.keys(schema).length > 0 ? jsonSchemaError(schema) : undefined
  if (converted !== undefined) {
    const message = `Unable to generate parser for this template. Automatic parser generation failed: ${converted}`
    return { status: 400, message }
  }
  if (b.logprobs === true && nTools > 0 && valueOr(b, "stream", false, isBool))
    return { status: 400, message: "logprobs is not supported with tools + stream" }
  return undefined
}
