// mlx-lm's OpenAI response shapes (pure), key for key in its order (it writes Python dicts with json.dumps).
// ml-explore/mlx-lm mlx_lm/server.py @0130d3b (the newest copy read), APIHandler.generate_response (every stream
// chunk and the whole answer), completion_usage_response (the usage chunk) and handle_completion (what it sends
// when). Older copies add `content`/`reasoning`/`tool_calls` to a chat delta only when set; this models the newest.
import type { Endpoint, StreamTemplate, Usage } from "./chunks.ts"

/**
 * What mlx-lm names itself in `system_fingerprint`, on every chunk: get_system_fingerprint(),
 * "<mlx-lm version>-<mlx version>-<platform.platform()>-<GPU architecture>"; the simulator's stands in.
 */
export const MLX_FINGERPRINT = "0.0.0-0.0.0-cgn-sim-applegpu"

/** The prefill chunk mlx-lm's server processes at a time (`--prefill-step-size`, default 2048). */
const PREFILL_STEP = 2048

/** What the request's usage says of its prompt: its length and the part found in mlx-lm's prompt cache. */
export interface MlxPrompt {
  readonly promptTokens: number
  readonly cachedTokens: number
}

/**
 * The SSE comments mlx-lm writes while it processes a streamed request's prompt, before the first token:
 * handle_completion's keepalive_callback writes `: keepalive N/M` for each progress report, and the prefill loop
 * (mlx_lm/generate.py generate_step) reports 0 first, then after each chunk of at most `--prefill-step-size`
 * tokens, up to all but the last token (which the first decode step takes). M counts the tokens not found in the
 * prompt cache (the server hands the generator only `rest`).
 */
export const mlxKeepalives = (p: MlxPrompt): string => {
  const total = Math.max(0, p.promptTokens - p.cachedTokens)
  let out = `: keepalive 0/${total}\n\n`
  for (let done = 0; total - done > 1; ) {
    done += Math.min(PREFILL_STEP, total - done - 1)
    out += `: keepalive ${done}/${total}\n\n`
  }
  return out
}

/** completion_usage_response / generate_response's usage: `prompt_tokens_details` once the cache was looked up. */
const usageJson = (u: Usage, p: MlxPrompt): string =>
  `{"prompt_tokens":${u.prompt_tokens},"completion_tokens":${u.completion_tokens},"total_tokens":${u.total_tokens},` +
  `"prompt_tokens_details":{"cached_tokens":${p.cachedTokens}}}`

/** A chat delta or message: role, text, and the (empty) reasoning and tool calls, always all four. */
const chatDelta = (text: string): string =>
  `{"role":"assistant","content":${JSON.stringify(text)},"reasoning":"","tool_calls":[]}`

export const mlxStreamTemplate = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  prompt: MlxPrompt
): StreamTemplate => {
  const head = (object: string) =>
    `{"id":${JSON.stringify(id)},"system_fingerprint":"${MLX_FINGERPRINT}","object":"${object}","model":${JSON.stringify(model)},"created":${created},"choices":`
  const chunkHead = head(endpoint === "chat" ? "chat.completion.chunk" : "text_completion")
  const choice = (reason: string | null, text: string) =>
    `[{"index":0,"finish_reason":${JSON.stringify(reason)},` +
    (endpoint === "chat" ? `"delta":${chatDelta(text)}}]}` : `"text":${JSON.stringify(text)}}]}`)
  return {
    // no opening role chunk: the keep-alive comments of the prompt's processing come first
    first: mlxKeepalives(prompt),
    // a chunk only for text gathered (handle_completion, `elif segment or tool_calls or reasoning_text`)
    token: (t) => (t === "" ? "" : `data: ${chunkHead}${choice(null, t)}\n\n`),
    finishWithLastToken: false,
    end: (r, u, includeUsage, last) =>
      `data: ${chunkHead}${choice(r, last ?? "")}\n\n` +
      // "chat.completion" on /v1/completions too (completion_usage_response)
      (includeUsage ? `data: ${head("chat.completion")}[],"usage":${usageJson(u, prompt)}}\n\n` : "")
  }
}

/** The whole (non-streamed) answer: generate_response with the counts. */
export const mlxFullBody = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  end: { readonly content: string; readonly reason: string },
  usage: Usage,
  prompt: MlxPrompt
): Record<string, unknown> => {
  const object = endpoint === "chat" ? "chat.completion" : "text_completion"
  const choice =
    endpoint === "chat"
      ? { index: 0, finish_reason: end.reason, message: JSON.parse(chatDelta(end.content)) as unknown }
      : { index: 0, finish_reason: end.reason, text: end.content }
  return {
    id,
    system_fingerprint: MLX_FINGERPRINT,
    object,
    model,
    created,
    choices: [choice],
    usage: JSON.parse(usageJson(usage, prompt)) as unknown
  }
}
