// llama-server's OpenAI response shapes (pure), key for key in its order (it writes nlohmann::ordered_json):
// ggml-org/llama.cpp tools/server/server-task.cpp, server_task_result_cmpl_partial (stream chunks) and
// server_task_result_cmpl_final (the last chunk, or the whole answer), usage_json_oaicompat, and
// server_slot_stats::to_json (`timings`, tools/server/server-common.cpp). Its ids are "chatcmpl-" and 32
// random letters and digits for completions too, whatever X-Request-Id says (server-common.cpp gen_chatcmplid).
import { randomInt } from "node:crypto"
import type { Endpoint, StreamTemplate, TokenAt, Usage } from "./chunks.ts"
import { tokenId, WORDS } from "./tokens.ts"

/** What a request asks of llama-server's chunks beyond the text (request.ts reads it). */
export interface LlamaOut {
  /** `n_probs` (chat: top_logprobs): the top tokens listed with each token's logprob; 0: `logprobs` null. */
  readonly nProbs: number
  /** `post_sampling_probs`: probabilities (`prob`, `top_probs`) instead of logprobs. */
  readonly postSamplingProbs: boolean
  /** `timings_per_token`: `timings` on every chunk. */
  readonly timingsPerToken: boolean
  /**
   * The choices whose task begins with a `data: null` event (request.ts), and how many choices, from the first,
   * hold their slots as the answer starts (generate.ts, requestSlots.ts): a later one begins as it takes its slot.
   */
  readonly begins: ReadonlyArray<number>
  readonly slots: number
  /** `n_predict` as asked (-1: none), for /slots (llamaSlots.ts). */
  readonly nPredict: number
}

const NO_OUT: LlamaOut = {
  nProbs: 0,
  postSamplingProbs: false,
  timingsPerToken: false,
  begins: [],
  slots: 1,
  nPredict: -1
}

/**
 * One token's entry of `logprobs.content` (completion_token_output::probs_vector_to_json): its id, text, bytes,
 * logprob and the top `n` tokens, most likely first. The values are the simulator's: the token itself at 1/2,
 * then other words at 1/4, 1/8, ...
 */
const probEntry = (piece: string, o: LlamaOut) => {
  const [p, top] = o.postSamplingProbs ? ["prob", "top_probs"] : ["logprob", "top_logprobs"]
  const value = (x: number) => (o.postSamplingProbs ? x : Math.log(x))
  const item = (t: string, x: number) => ({
    id: tokenId(t.trim()),
    token: t,
    bytes: [...Buffer.from(t)],
    [p]: value(x)
  })
  const others = WORDS.filter((w) => w !== piece.trim()).map((w) => ` ${w}`)
  const list = [piece, ...others].slice(0, o.nProbs).map((t, i) => item(t, 2 ** -(i + 1)))
  return { ...item(piece, 0.5), [top]: list }
}

/** A text's `logprobs` object: one entry per token (the simulator's tokens are words with their leading space). */
const probsOf = (text: string, o: LlamaOut): string =>
  JSON.stringify({ content: (text.match(/\s*\S+/g) ?? []).map((t) => probEntry(t, o)) })

/** What llama-server's builds name themselves in `system_fingerprint` (llama_build_info(): "b<n>-<commit>"). */
export const LLAMA_FINGERPRINT = "b0-cgnsim"

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
export const llamaStreamTemplate = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  o: LlamaOut = NO_OUT
): StreamTemplate => {
  const idJson = JSON.stringify(id)
  const modelJson = JSON.stringify(model)
  // a task's begin: those in a slot from the start before anything, a later one as it takes its slot, before its
  // prompt is evaluated (its TTFT) and its first token
  const first = "data: null\n\n".repeat(o.begins.filter((i) => i < o.slots).length)
  const begin = (index: number) => (index >= o.slots && o.begins.includes(index) ? "data: null\n\n" : "")
  const timed = (at: TokenAt | undefined) =>
    at !== undefined && (at.stopped || o.timingsPerToken) ? `,"timings":${timings(at.usage)}` : ""
  const probs = (t: string) => (o.nProbs > 0 ? probsOf(t, o) : "null")
  if (endpoint === "completion") {
    const tail = `"created":${created},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"text_completion"`
    return {
      first,
      begin,
      token: (t, at) =>
        `data: {"choices":[{"text":${JSON.stringify(t)},"index":${at?.index ?? 0},"logprobs":${probs(t)},"finish_reason":null}],${tail},"id":${idJson}` +
        `${timed(at)}}\n\n`,
      finishWithLastToken: false,
      end: (r, u, _includeUsage, _last, index = 0) =>
        `data: {"choices":[{"text":"","index":${index},"logprobs":null,"finish_reason":${JSON.stringify(r)}}],${tail},` +
        `"usage":${JSON.stringify(usageJson(u))},"id":${idJson},"timings":${timings(u)}}\n\n`
    }
  }
  const tail = `"created":${created},"id":${idJson},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"chat.completion.chunk"`
  const chunk = (choice: string, extra = "") => `data: {"choices":[${choice}],${tail}${extra}}\n\n`
  const delta = (index: number, d: string, lp = "") => `{"finish_reason":null,"index":${index},"delta":${d}${lp}}`
  return {
    first,
    begin,
    token: (t, at) => {
      const index = at?.index ?? 0
      const parts: Array<string> = []
      // the token's logprobs go on its last delta (to_json_oaicompat_chat)
      const lp = o.nProbs > 0 ? `,"logprobs":${probsOf(t, o)}` : ""
      if (at?.first === true) parts.push(delta(index, `{"role":"assistant","content":null}`, t === "" ? lp : ""))
      if (t !== "") parts.push(delta(index, `{"content":${JSON.stringify(t)}}`, lp))
      return parts.map((p, i) => chunk(p, i === parts.length - 1 ? timed(at) : "")).join("")
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
  r: { readonly endpoint: Endpoint; readonly llama?: LlamaOut | undefined },
  id: string,
  model: string,
  created: number,
  choices: ReadonlyArray<LlamaChoice>,
  usage: Usage
): Record<string, unknown> => {
  const { endpoint } = r
  const o = r.llama ?? NO_OUT
  const probs = (text: string) => (o.nProbs > 0 ? (JSON.parse(probsOf(text, o)) as unknown) : null)
  const chat = (c: LlamaChoice, index: number) => {
    const choice = { finish_reason: c.finishReason, index, message: { role: "assistant", content: c.text } }
    return o.nProbs > 0 ? { ...choice, logprobs: probs(c.text) } : choice
  }
  return {
    choices: choices.map((c, index) =>
      endpoint === "chat"
        ? chat(c, index)
        : { text: c.text, index, logprobs: probs(c.text), finish_reason: c.finishReason }
    ),
    created,
    model,
    system_fingerprint: LLAMA_FINGERPRINT,
    object: endpoint === "chat" ? "chat.completion" : "text_completion",
    usage: usageJson(usage),
    id,
    timings: JSON.parse(timings(usage)) as unknown
  }
}
