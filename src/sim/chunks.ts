// OpenAI response shapes (pure): SSE chunk templates for streams and whole bodies for non-streaming calls.
// A stream's constant JSON prefix/suffix is built once per request, so each token costs one small
// JSON.stringify of the token text and a string concatenation, never a stringify of a big object.
import { llamaStreamTemplate } from "./llamaChunks.ts"
import type { Flavor } from "./simConfig.ts"

export type Endpoint = "chat" | "completion"

export interface Usage {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly total_tokens: number
}

/** Where a token falls, for an engine whose chunks say more than its text (llama.cpp: llamaChunks.ts). */
export interface TokenAt {
  /** The choice it belongs to (llama.cpp answers `n` and several prompts in one stream). */
  readonly index: number
  /** Its sequence's first token. */
  readonly first: boolean
  /** A stop string ended the sequence at this token. */
  readonly stopped: boolean
  /** The sequence's counts so far, this token included. */
  readonly usage: Usage
}

export interface StreamTemplate {
  /** The chat stream's opening role chunk (empty for completions, and for llama.cpp, which opens each choice). */
  readonly first: string
  /** The chunk(s) of one token's text; llama.cpp's chat stream sends none for an empty text. */
  token(text: string, at?: TokenAt): string
  /**
   * Whether the engine sends the last token's text in the chunk that carries the finish reason (then the
   * generator hands that text to `end` as `last` instead of to `token`), or the finish reason in a chunk of its own.
   */
  readonly finishWithLastToken: boolean
  /**
   * The chunks that end the stream before `data: [DONE]`: the finish reason (with `last`, the last token's
   * text, when the engine merges them) and, when asked, the usage.
   */
  end(reason: string, u: Usage, includeUsage: boolean, last?: string, index?: number): string
}

export const DONE = "data: [DONE]\n\n"

const owner = (f: Flavor): string => (f === "llama_cpp" ? "llamacpp" : f)

/** SSE framing for one JSON text. */
export const sse = (json: string): string => `data: ${json}\n\n`

/**
 * vLLM ends a stream with the last token's text and the finish reason in one chunk: the engine's last output
 * carries both (vllm-project/vllm vllm/entrypoints/openai/completion/serving.py, CompletionResponseStreamChoice
 * with `text=delta_text, finish_reason=...`; vllm/entrypoints/openai/chat_completion/serving.py, "if the model is
 * finished generating": `delta=delta_message` with the finish reason). SGLang does the same for completions
 * (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_completions.py, one chunk per output with
 * `text=delta` and its finish reason), but ends a chat stream with a chunk of its own, `delta: {}`
 * (serving_chat.py, "Send finish_reason chunks for each index that completed"). mlx-lm writes every token as
 * it comes and then a finish chunk with the (empty) rest (ml-explore/mlx-lm mlx_lm/server.py, handle_completion).
 */
const mergesFinish = (endpoint: Endpoint, flavor: Flavor | undefined): boolean =>
  flavor === "vllm" || (flavor === "sglang" && endpoint === "completion")

export const streamTemplate = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  flavor?: Flavor
): StreamTemplate => {
  if (flavor === "llama_cpp") return llamaStreamTemplate(endpoint, id, model, created)
  const object = endpoint === "chat" ? "chat.completion.chunk" : "text_completion"
  const head = `{"id":${JSON.stringify(id)},"object":"${object}","created":${created},"model":${JSON.stringify(model)},"choices":`
  const usageChunk = (u: Usage, includeUsage: boolean) =>
    includeUsage ? `data: ${head}[],"usage":${JSON.stringify(u)}}\n\n` : ""
  const finishWithLastToken = mergesFinish(endpoint, flavor)
  if (endpoint === "chat") {
    const tokPre = `data: ${head}[{"index":0,"delta":{"content":`
    const tokPost = `},"logprobs":null,"finish_reason":null}]}\n\n`
    return {
      first: `data: ${head}[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`,
      token: (t) => tokPre + JSON.stringify(t) + tokPost,
      finishWithLastToken,
      end: (r, u, includeUsage, last) => {
        const delta = last === undefined ? "{}" : `{"content":${JSON.stringify(last)}}`
        return (
          `data: ${head}[{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${JSON.stringify(r)},"stop_reason":null}]}\n\n` +
          usageChunk(u, includeUsage)
        )
      }
    }
  }
  const tokPre = `data: ${head}[{"index":0,"text":`
  const tokPost = `,"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n`
  return {
    first: "",
    token: (t) => tokPre + JSON.stringify(t) + tokPost,
    finishWithLastToken,
    end: (r, u, includeUsage, last) =>
      `data: ${head}[{"index":0,"text":${JSON.stringify(last ?? "")},"logprobs":null,"finish_reason":${JSON.stringify(r)},"stop_reason":null}]}\n\n` +
      usageChunk(u, includeUsage)
  }
}

/** The non-streaming response object. */
export const fullBody = (
  flavor: Flavor,
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  text: string,
  finishReason: string,
  usage: Usage,
  kvTransferParams: unknown
): Record<string, unknown> => {
  const choice =
    endpoint === "chat"
      ? {
          index: 0,
          message: { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: finishReason,
          stop_reason: null
        }
      : { index: 0, text, logprobs: null, finish_reason: finishReason, stop_reason: null }
  const body: Record<string, unknown> = {
    id,
    object: endpoint === "chat" ? "chat.completion" : "text_completion",
    created,
    model,
    choices: [choice],
    usage
  }
  if (flavor === "vllm") body.kv_transfer_params = kvTransferParams ?? null
  return body
}

/** GET /v1/models per flavor. */
export const modelsBody = (
  flavor: Flavor,
  servedName: string,
  model: string,
  maxModelLen: number | undefined,
  created: number
): unknown => {
  const entry: Record<string, unknown> = { id: servedName, object: "model", created, owned_by: owner(flavor) }
  if (flavor === "vllm") {
    Object.assign(entry, { root: model, parent: null, max_model_len: maxModelLen ?? 4096, permission: [] })
  } else if (flavor === "sglang") {
    Object.assign(entry, { root: servedName, max_model_len: maxModelLen ?? 4096 })
  } else if (flavor === "llama_cpp") {
    // tools/server/server-context.cpp get_res_models / get_res_model_info; the meta numbers are placeholders.
    const ctx = maxModelLen ?? 4096
    const meta = {
      vocab_type: 1,
      n_vocab: 32000,
      n_ctx: ctx,
      n_ctx_train: ctx,
      n_embd: 4096,
      n_params: 0,
      size: 0,
      ftype: "F32"
    }
    const data = [
      { id: servedName, aliases: [servedName], tags: [], object: "model", created, owned_by: "llamacpp", meta }
    ]
    const details = {
      parent_model: "",
      format: "gguf",
      family: "",
      families: [""],
      parameter_size: "",
      quantization_level: ""
    }
    const listed = { name: servedName, model: servedName, modified_at: "", size: "", digest: "", type: "model" }
    const more = { description: "", tags: [""], capabilities: ["completion"], parameters: "", details }
    return { models: [{ ...listed, ...more }], object: "list", data }
  } else {
    delete entry.owned_by
  }
  return { object: "list", data: [entry] }
}
