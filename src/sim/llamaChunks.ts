// llama-server's OpenAI response shapes (pure), key for key in its order (it writes nlohmann::ordered_json):
// ggml-org/llama.cpp tools/server/server-task.cpp, server_task_result_cmpl_partial (stream chunks) and
// server_task_result_cmpl_final (the last chunk, or the whole answer), usage_json_oaicompat, and
// server_slot_stats::to_json (`timings`, tools/server/server-common.cpp). Its ids are "chatcmpl-" and 32
// random letters and digits for completions too, whatever X-Request-Id says (server-common.cpp gen_chatcmplid).
import { randomInt } from "node:crypto"
import type { Endpoint, StreamTemplate, TokenAt, Usage } from "./chunks.ts"
import { finalVerbose, type LlamaOut, timings } from "./llamaOut.ts"
import { tokenId, WORDS } from "./tokens.ts"

export type { LlamaOut }

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
  const timed = (at: TokenAt | undefined) =>
    at !== undefined && (at.stopped || o.timingsPerToken) ? `,"timings":${timings(at.usage)}` : ""
  const probs = (t: string) => (o.nProbs > 0 ? probsOf(t, o) : "null")
  const v = o.verbose
  // a partial result's `__verbose` (completions only: the chat's partial chunks carry none)
  const partialVerbose = (index: number, text: string, tokens: number, extra: string) =>
    v === undefined || endpoint === "chat"
      ? ""
      : `,"__verbose":{"index":${index},"content":${JSON.stringify(text)},"tokens":[${text === "" ? 0 : tokenId(text.trim())}],` +
        `"stop":false,"id_slot":-1,"tokens_predicted":${tokens},"tokens_evaluated":${v.promptTokens[index] ?? 0}${extra}}`
  // return_progress: each task's prompt_progress chunks (a 0% one as it starts, one as its prompt is evaluated; a
  // child's only the latter) stand for its begin (server-context.cpp update_slots, send_partial_response is_progress)
  const progressChunks = (index: number): string => {
    const p = o.progress?.[index]
    if (p === undefined) return ""
    return (p.child ? [p.total] : [0, p.total])
      .map((done) => {
        const t = { prompt_tokens: done, completion_tokens: 0, total_tokens: done }
        const timedNow = o.timingsPerToken ? `,"timings":${timings(t)}` : ""
        const progress = `,"prompt_progress":{"total":${p.total},"cache":0,"processed":${done},"time_ms":0}`
        return progressChunk(index, `${partialVerbose(index, "", 0, `${timedNow}${progress}`)}${timedNow}${progress}`)
      })
      .join("")
  }
  const completionTail = `"created":${created},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"text_completion"`
  const chatTail = `"created":${created},"id":${idJson},"model":${modelJson},"system_fingerprint":"${LLAMA_FINGERPRINT}","object":"chat.completion.chunk"`
  const chunk = (choice: string, extra = "") => `data: {"choices":[${choice}],${chatTail}${extra}}\n\n`
  const delta = (index: number, d: string, lp = "") => `{"finish_reason":null,"index":${index},"delta":${d}${lp}}`
  const progressChunk = (index: number, extra: string): string =>
    endpoint === "completion"
      ? `data: {"choices":[{"text":"","index":${index},"logprobs":null,"finish_reason":null}],${completionTail},"id":${idJson}${extra}}\n\n`
      : chunk(delta(index, `{"role":"assistant","content":null}`), extra)
  const verboseEnd = (index: number, u: Usage, r: string, matched: string | undefined) =>
    v === undefined ? "" : `,"__verbose":${finalVerbose(v, model, index, "", u, r, matched)}`
  // a task's begin: those in a slot from the start before anything, a later one as it takes its slot, before its
  // prompt is evaluated (its TTFT) and its first token
  const first =
    o.progress === undefined
      ? "data: null\n\n".repeat(o.begins.filter((i) => i < o.slots).length)
      : Array.from({ length: Math.min(o.slots, o.progress.length) }, (_, i) => progressChunks(i)).join("")
  const begin = (index: number) =>
    index < o.slots
      ? ""
      : o.progress !== undefined
        ? progressChunks(index)
        : o.begins.includes(index)
          ? "data: null\n\n"
          : ""
  if (endpoint === "completion") {
    const tail = completionTail
    return {
      first,
      begin,
      token: (t, at) => {
        const index = at?.index ?? 0
        const pv = partialVerbose(index, t, at?.usage.completion_tokens ?? 0, timed(at))
        return (
          `data: {"choices":[{"text":${JSON.stringify(t)},"index":${index},"logprobs":${probs(t)},"finish_reason":null}],${tail},"id":${idJson}` +
          `${pv}${timed(at)}}\n\n`
        )
      },
      finishWithLastToken: false,
      end: (r, u, _includeUsage, _last, index = 0, matched) =>
        `data: {"choices":[{"text":"","index":${index},"logprobs":null,"finish_reason":${JSON.stringify(r)}}],${tail},` +
        `"usage":${JSON.stringify(usageJson(u))},"id":${idJson}${verboseEnd(index, u, r, matched)},"timings":${timings(u)}}\n\n`
    }
  }
  const tail = chatTail
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
    end: (r, u, includeUsage, _last, index = 0, matched) => {
      const withTimings = `,"timings":${timings(u)}`
      const finish = `{"finish_reason":${JSON.stringify(r)},"index":${index},"delta":{}}`
      // timings go on the last chunk, `__verbose` on the first (to_json_oaicompat_chat_stream)
      const verbose = verboseEnd(index, u, r, matched)
      return includeUsage
        ? `${chunk(finish, verbose)}data: {"choices":[],${tail},"usage":${JSON.stringify(usageJson(u))}${withTimings}}\n\n`
        : chunk(finish, `${withTimings}${verbose}`)
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
    // `__verbose`: the first result's (its choices and counts are the answer's)
    ...(o.verbose === undefined
      ? {}
      : {
          __verbose: JSON.parse(
            finalVerbose(o.verbose, model, 0, choices[0]?.text ?? "", usage, choices[0]?.finishReason ?? "length")
          ) as unknown
        }),
    timings: JSON.parse(timings(usage)) as unknown
  }
}
