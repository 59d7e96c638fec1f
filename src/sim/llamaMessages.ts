// How llama-server reads a chat request's messages (pure): oaicompat_chat_params_parse's checks (tools/server/
// server-common.cpp), common/chat.cpp common_chat_msgs_parse_oaicompat's, the assistant prefill and `logprobs`.
// Errors keep llama-server's wording (checked against it by test/real/sim-differential.test.ts).
import { chatEarlyChecks, chatLateChecks, messageExtras } from "./llamaChatChecks.ts"
import { BOS, type LlamaInvalid, type LlamaPrompt, typeError } from "./llamaRequest.ts"
import { type ChatPrompt, renderChat } from "./llamaTemplate.ts"
import { words } from "./tokens.ts"

const PART_TYPES_500: Record<string, string> = {
  image_url: "image",
  input_audio: "audio",
  input_video: "video"
}

/**
 * A message's text parts and its tool calls, or the error common_chat_msgs_parse_oaicompat throws (as a string)
 * for one: its role, its content, then the fields after it (llamaChatChecks.ts messageExtras).
 */
const messageText = (m: Record<string, unknown>): { text: string; calls: number } | { readonly error: string } => {
  if (!("role" in m)) return { error: `Missing 'role' in message: ${JSON.stringify(m)}` }
  if (typeof m.role !== "string") return { error: typeError("string", m.role) }
  const c = m.content
  const texts: Array<string> = typeof c === "string" ? [c] : []
  for (const part of Array.isArray(c) ? (c as Array<Record<string, unknown>>) : []) {
    if (!("text" in part)) return { error: "[json.exception.out_of_range.403] key 'text' not found" }
    if (typeof part.text !== "string") return { error: typeError("string", part.text) }
    texts.push(part.text)
  }
  const calls = messageExtras(m)
  return typeof calls === "number" ? { text: texts.join(" "), calls } : calls
}

/**
 * /v1/chat/completions' and /apply-template's chat: oaicompat_chat_params_parse's checks in its order: the
 * json_schema and response_format (llamaChatChecks.ts), the messages' shape (400s), the parse into chat
 * messages, whose errors llama-server answers 500 ("Failed to parse messages: ..."), then the tools and the
 * other chat fields (llamaChatChecks.ts). Unknown roles, an empty list and a conversation of one system message
 * all pass: the chat template renders what it is given.
 * Returns the chat rendered (llamaTemplate.ts; add_generation_prompt read as json_value reads it: a boolean, true
 * unless given), its prompt's tokens (the rendering's after the BOS) and the words of its messages, which the
 * simulator's echo mode answers with.
 */
export const llamaMessages = (body: unknown): (LlamaPrompt & Pick<ChatPrompt, "text">) | LlamaInvalid => {
  const b = typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : {}
  const early = chatEarlyChecks(b)
  if ("status" in early) return early
  if (!("messages" in b)) return { status: 400, message: "'messages' is required" }
  const messages = b.messages
  if (!Array.isArray(messages)) return { status: 400, message: "Expected 'messages' to be an array" }
  for (const raw of messages) {
    const m = typeof raw === "object" && raw !== null && !Array.isArray(raw) ? (raw as Record<string, unknown>) : {}
    const role = typeof m.role === "string" ? m.role : ""
    if (role !== "assistant" && !("content" in m)) {
      return { status: 400, message: "All non-assistant messages must contain 'content'" }
    }
    if (role === "assistant" && !("content" in m) && !("tool_calls" in m)) {
      return { status: 400, message: "Assistant message must contain either 'content' or 'tool_calls'!" }
    }
    const c = m.content
    if (c === undefined || c === null || typeof c === "string") continue
    if (!Array.isArray(c)) return { status: 400, message: "Expected 'content' to be a string or an array" }
    for (const p of c) {
      const type = typeof p === "object" && p !== null && typeof p.type === "string" ? (p.type as string) : ""
      const media = PART_TYPES_500[type]
      if (media !== undefined) {
        const hint = "hint: if this is unexpected, you may need to provide the mmproj"
        return { status: 500, message: `${media} input is not supported - ${hint}` }
      }
      if (type !== "text") return { status: 400, message: "unsupported content[].type" }
    }
  }
  const texts: Array<string> = []
  let lastCalls = 0
  for (const m of messages as Array<Record<string, unknown>>) {
    const t = messageText(m)
    if ("error" in t) return { status: 500, message: `Failed to parse messages: ${t.error}` }
    texts.push(t.text)
    lastCalls = t.calls
  }
  const n = messages.length
  const [last, before] = [messages[n - 1], messages[n - 2]] as Array<{ role?: unknown } | undefined>
  const tail = { count: n, lastRole: last?.role, lastCalls, beforeRole: before?.role }
  const late = chatLateChecks(b, tail, early.schema)
  if (late !== undefined) return late
  const probs = llamaChatProbs(b)
  if (typeof probs === "object") return probs
  const chat = renderChat(messages, b.add_generation_prompt !== false)
  return { words: words(texts.join(" ")), text: chat.text, tokens: [BOS, ...chat.tokens] }
}

/**
 * A chat ending with the assistant's message is continued (--prefill-assistant, on by default): its text leads the
 * answer as it is, neither counted nor looked at for stop strings; the first generated word brings its own space
 * (measured: "The" then " will" is "The will"). The echo mode's first word has none (not a real engine's): one is
 * added there.
 */
export const llamaAssistantPrefill = (body: unknown, echo = false): { readonly assistantPrefill?: string } => {
  const messages = (body as { messages?: unknown }).messages
  const last = Array.isArray(messages) ? (messages.at(-1) as { role?: unknown; content?: unknown }) : undefined
  if (last?.role !== "assistant" || typeof last.content !== "string" || last.content === "") return {}
  return { assistantPrefill: !echo || /\s$/.test(last.content) ? last.content : `${last.content} ` }
}

/**
 * Chat `logprobs` (oaicompat_chat_params_parse, "Handle logprobs field"): true asks for `top_logprobs` (default 20)
 * top tokens; `top_logprobs` without it is refused. Undefined: the request's n_probs decides.
 */
export const llamaChatProbs = (body: unknown): number | undefined | LlamaInvalid => {
  const b = body as { logprobs?: unknown; top_logprobs?: unknown }
  if (b.logprobs === true) return typeof b.top_logprobs === "number" ? b.top_logprobs : 20
  if (b.top_logprobs !== undefined && b.top_logprobs !== null)
    return { status: 400, message: "top_logprobs requires logprobs to be set to true" }
  return undefined
}
