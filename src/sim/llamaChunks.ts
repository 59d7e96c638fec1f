// llama-server's OpenAI response shapes (pure), key for key in its order (it writes nlohmann::ordered_json):
// ggml-org/llama.cpp tools/server/server-task.cpp, server_task_result_cmpl_partial (stream chunks) and
// server_task_result_cmpl_final (the last chunk, or the whole answer), usage_json_oaicompat, and
// server_slot_stats::to_json (`timings`, tools/server/server-common.cpp). Its ids are "chatcmpl-" and 32
// random letters and digits for completions too, whatever X-Request-Id says (server-common.cpp gen_chatcmplid).
import { randomInt } from "node:crypto"
import type { Endpoint, StreamTemplate, Usage } from "./chunks.ts"

/** What llama-server's builds name themselves in `system_fingerprint` (llama_build_info(): "b<n>-<commit>"). */
const LLAMA_FINGERPRINT = "b0-cgnsim"

const ID_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

/** A response id as llama-server makes one (server-common.cpp random_string: 32 of ID_CHARS). */
export const llamaId = (): string =>
  `chatcmpl-${Array.from({ length: 32 }, () => ID_CHARS[randomInt(ID_CHARS.length)]).join("")}`

/** `timings` (server_slot_stats::to_json); the simulator takes no time. */
const timings = (u: Usage): string =>
  JSON.stringify({
    cache_n: 0,
    prompt_n: u.prompt_tokens,
    prompt_ms: 0,
    prompt_per_token_ms: 0,
    prompt_per_second: 0,
    predicted_n: u.completion_tokens,
    predicted_ms: 0,
    predicted_per_token_ms: 0,
    predicted_per_second: 0
  })

/** usage_json_oaicompat. */
const usageJson = (u: Usage) => ({
  completion_tokens: u.completion_tokens,
  prompt_tokens: u.prompt_tokens,
  total_tokens: u.total_tokens,
  prompt_tokens_details: { cached_tokens: 0 }
})

/**
 * The stream: every token is a chunk (`timings` on it when a stop string ended the sequence there: the stop
 * is known before the chunk is sent, server-context.cpp process_token); a completion choice ends with one
 * chunk carrying the finish reason, the usage (asked for or not) and `timings`. A chat choice opens with a
 * role chunk whose content is null, sends no chunk for a token whose text is empty (no diff), and ends with
 * the finish chunk, then the usage chunk (`choices: []`) when asked, `timings` on the last. With several
 * choices each ends on its own, then one `data: [DONE]`.
 */
export const llamaStreamTemplate = (endpoint: Endpoint, id: string, model: string, created: number): StreamTemplate => {
  const idJson = JSON.stringify(id)
  const modelJson = JSON.stringify(model)
  if (endpoint === "completion") {
    const tail = `"created":${created},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"text_completion"`
    return {
      first: "",
      token: (t, at) =>
        `data: {"choices":[{"text":${JSON.stringify(t)},"index":${at?.index ?? 0},"logprobs":null,"finish_reason":null}],${tail},"id":${idJson}` +
        `${at?.stopped === true ? `,"timings":${timings(at.usage)}` : ""}}\n\n`,
      finishWithLastToken: false,
      end: (r, u, _includeUsage, _last, index = 0) =>
        `data: {"choices":[{"text":"","index":${index},"logprobs":null,"finish_reason":${JSON.stringify(r)}}],${tail},` +
        `"usage":${JSON.stringify(usageJson(u))},"id":${idJson},"timings":${timings(u)}}\n\n`
    }
  }
  const tail = `"created":${created},"id":${idJson},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"chat.completion.chunk"`
  const chunk = (choice: string, extra = "") => `data: {"choices":[${choice}],${tail}${extra}}\n\n`
  const delta = (index: number, d: string) => `{"finish_reason":null,"index":${index},"delta":${d}}`
  return {
    first: "",
    token: (t, at) => {
      const index = at?.index ?? 0
      const parts: Array<string> = []
      if (at?.first === true) parts.push(delta(index, `{"role":"assistant","content":null}`))
      if (t !== "") parts.push(delta(index, `{"content":${JSON.stringify(t)}}`))
      const stopTimings = at?.stopped === true ? `,"timings":${timings(at.usage)}` : ""
      return parts.map((p, i) => chunk(p, i === parts.length - 1 ? stopTimings : "")).join("")
    },
    finishWithLastToken: false,
    end: (r, u, includeUsage, _last, index = 0) => {
      const withTimings = `,"timings":${timings(u)}`
      const finish = `{"finish_reason":${JSON.stringify(r)},"index":${index},"delta":{}}`
      return includeUsage
        ? `${chunk(finish)}data: {"choices":[],${tail},"usage":${JSON.stringify(usageJson(u))}${withTimings}}\n\n`
        : chunk(finish, withTimings)
    }
  }
}

export interface LlamaChoice {
  readonly text: string
  readonly finishReason: string
}

/**
 * The whole answer (to_json_oaicompat / to_json_oaicompat_chat). Several choices (n, several prompts) are the
 * first result with the others' choices appended: its usage and timings are the first choice's
 * (server-context.cpp handle_completions_impl, "if multiple results in OAI format").
 */
export const llamaFullBody = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  choices: ReadonlyArray<LlamaChoice>,
  usage: Usage
): Record<string, unknown> => ({
  choices: choices.map((c, index) =>
    endpoint === "chat"
      ? { finish_reason: c.finishReason, index, message: { role: "assistant", content: c.text } }
      : { text: c.text, index, logprobs: null, finish_reason: c.finishReason }
  ),
  created,
  model,
  system_fingerprint: LLAMA_FINGERPRINT,
  object: endpoint === "chat" ? "chat.completion" : "text_completion",
  usage: usageJson(usage),
  id,
  timings: JSON.parse(timings(usage)) as unknown
})
