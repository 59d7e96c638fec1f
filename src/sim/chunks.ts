// OpenAI response shapes (pure): SSE chunk templates for streams and whole bodies for non-streaming calls.
// A stream's constant JSON prefix/suffix is built once per request, so each token costs one small
// JSON.stringify of the token text and a string concatenation, never a stringify of a big object.
import { SIM_MODEL_CONTEXT } from "./contextLimit.ts"
import { type LlamaOut, llamaStreamTemplate } from "./llamaChunks.ts"
import { type MlxPrompt, mlxFullBody, mlxStreamTemplate } from "./mlxChunks.ts"
import type { Flavor } from "./simConfig.ts"
import { SIM_EOS_TOKEN_ID } from "./stopRules.ts"

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
  /**
   * What opens the stream: the chat stream's role chunk (none for completions, nor for llama.cpp, which opens each
   * choice); for mlx-lm, the keep-alive comments of the prompt's processing (mlxChunks.ts).
   */
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
  end(reason: string, u: Usage, includeUsage: boolean, last?: string, index?: number, matched?: string): string
  /** llama.cpp: what goes out as choice `index`'s sequence takes its slot after the stream began (a task's begin). */
  begin?(index: number): string
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

/**
 * How a flavor's choices name what stopped them and which token chunks it sends, where the engines differ.
 * vLLM: `stop_reason`, the stop string (or stop token id), null otherwise; on every completion chunk, on a
 * chat chunk only with the finish (vllm/entrypoints/openai/completion/protocol.py CompletionResponseStreamChoice;
 * chat_completion/serving.py sets it on the finishing choice, dumped with exclude_unset); a chunk per token even
 * when its text is "" (the detokenizer holding back a possible stop). SGLang: `matched_stop`, the stop string or,
 * for an end of sequence, the EOS token id (schedule_batch.py FINISH_MATCHED_STR / FINISH_MATCHED_TOKEN), null on
 * "length", on every chunk (python/sglang/srt/entrypoints/openai/protocol.py, dumped whole); its chat stream sends
 * no content chunk for an empty delta (serving_chat.py, `if delta:`), its completion stream one per output.
 * mlx-lm: no such field, and a chunk only for text gathered (mlx_lm/server.py, `elif segment ...`).
 */
interface StopShape {
  readonly field: "stop_reason" | "matched_stop" | undefined
  /** On token chunks of completions / of chat, not only on the finish. */
  readonly onTokens: { readonly completion: boolean; readonly chat: boolean }
  readonly emptyChunks: { readonly completion: boolean; readonly chat: boolean }
}

const STOP_SHAPES: Record<Exclude<Flavor, "llama_cpp">, StopShape> = {
  vllm: {
    field: "stop_reason",
    onTokens: { completion: true, chat: false },
    emptyChunks: { completion: true, chat: true }
  },
  sglang: {
    field: "matched_stop",
    onTokens: { completion: true, chat: true },
    emptyChunks: { completion: true, chat: false }
  },
  mlx: {
    field: undefined,
    onTokens: { completion: false, chat: false },
    emptyChunks: { completion: false, chat: false }
  }
}

/** The stop field's value for a finished choice. */
const stopValue = (flavor: Flavor, reason: string, matched: string | undefined): string | number | null => {
  if (matched !== undefined) return matched
  return flavor === "sglang" && reason === "stop" ? SIM_EOS_TOKEN_ID : null
}

/** What a stream's chunks say besides their text: the prompt's counts and `stream_options.continuous_usage_stats`. */
export interface StreamOpts extends MlxPrompt {
  readonly continuousUsage: boolean
  /** llama.cpp: logprobs, per-token timings, task begins (llamaChunks.ts). */
  readonly llama?: LlamaOut | undefined
}

const NO_OPTS: StreamOpts = { promptTokens: 0, cachedTokens: 0, continuousUsage: false }

/**
 * A usage object as the engine writes it. vLLM: UsageInfo dumped with exclude_unset (vllm/entrypoints/openai/
 * engine/protocol.py). SGLang: UsageInfo (python/sglang/srt/entrypoints/openai/protocol.py) dumped whole, with
 * `prompt_tokens_details: null` (no --enable-cache-report) and `reasoning_tokens: 0`, but for the completion stream's
 * last chunk, dumped with exclude_none (serving_completions.py `final_usage_chunk.model_dump_json(exclude_none=True)`).
 */
const usageJson = (flavor: Flavor, u: Usage, dropNulls = false): string => {
  const counts = `"prompt_tokens":${u.prompt_tokens},"total_tokens":${u.total_tokens},"completion_tokens":${u.completion_tokens}`
  if (flavor !== "sglang") return `{${counts}}`
  return `{${counts}${dropNulls ? "" : ',"prompt_tokens_details":null'},"reasoning_tokens":0}`
}

export const streamTemplate = (
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  flavor: Flavor = "vllm",
  opts: StreamOpts = NO_OPTS
): StreamTemplate => {
  if (flavor === "llama_cpp") return llamaStreamTemplate(endpoint, id, model, created, opts.llama)
  if (flavor === "mlx") return mlxStreamTemplate(endpoint, id, model, created, opts)
  const shape = STOP_SHAPES[flavor]
  const sglang = flavor === "sglang"
  const object = endpoint === "chat" ? "chat.completion.chunk" : "text_completion"
  const head = `{"id":${JSON.stringify(id)},"object":"${object}","created":${created},"model":${JSON.stringify(model)},"choices":`
  // SGLang's chat usage chunk is dumped whole, its completion one without nulls (usageJson)
  const usageChunk = (u: Usage, includeUsage: boolean) =>
    includeUsage ? `data: ${head}[],"usage":${usageJson(flavor, u, sglang && endpoint === "completion")}}\n\n` : ""
  // SGLang's completion chunks are pydantic dumps: `"usage":null` when none (serving_completions.py
  // `chunk.model_dump_json()`); its chat chunks come from msgspec structs that leave an unset usage out
  // (sse_utils.py StreamChunk, omit_defaults)
  const chunkUsage = (u: Usage | undefined, on: boolean) =>
    on && u !== undefined
      ? `,"usage":${usageJson(flavor, u)}`
      : sglang && endpoint === "completion"
        ? ',"usage":null'
        : ""
  const finishWithLastToken = mergesFinish(endpoint, flavor)
  const stopOf = (value: string | number | null) =>
    shape.field === undefined ? "" : `,"${shape.field}":${JSON.stringify(value)}`
  const tokenStop = shape.onTokens[endpoint] ? stopOf(null) : ""
  const skipEmpty = !shape.emptyChunks[endpoint]
  // `usage` on every chunk (request.ts decides when: GenRequest.continuousUsage); vLLM's chat_completion/serving.py
  // and completion/serving.py set `chunk.usage` on each chunk, the opening one with completion_tokens 0
  const perChunk = opts.continuousUsage
  if (endpoint === "chat") {
    // SGLang's chat delta always carries `reasoning_content` (null here), its other unset fields left out
    // (sse_utils.py StreamDelta: reasoning_content has no default); each choice carries its nulls (StreamChoice)
    const reasoning = sglang ? '"reasoning_content":null,' : ""
    const tokPre = `data: ${head}[{"index":0,"delta":{${reasoning}"content":`
    const tokPost = `},"logprobs":null,"finish_reason":null${tokenStop}}]`
    const opening: Usage = { prompt_tokens: opts.promptTokens, total_tokens: opts.promptTokens, completion_tokens: 0 }
    return {
      // SGLang's opening chunk has no usage (build_sse_content without one); vLLM's has the prompt's
      first: `data: ${head}[{"index":0,"delta":{${reasoning}"role":"assistant","content":""},"logprobs":null,"finish_reason":null${sglang ? stopOf(null) : ""}}]${sglang ? "" : chunkUsage(opening, perChunk)}}\n\n`,
      token: (t, at) =>
        t === "" && skipEmpty ? "" : `${tokPre}${JSON.stringify(t)}${tokPost}${chunkUsage(at?.usage, perChunk)}}\n\n`,
      finishWithLastToken,
      end: (r, u, includeUsage, last, _index, matched) => {
        const delta =
          last === undefined ? (sglang ? '{"reasoning_content":null}' : "{}") : `{"content":${JSON.stringify(last)}}`
        // SGLang's separate finish chunk carries no usage (serving_chat.py, build_sse_content without one)
        return (
          `data: ${head}[{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${JSON.stringify(r)}${stopOf(stopValue(flavor, r, matched))}}]${sglang ? "" : chunkUsage(u, perChunk)}}\n\n` +
          usageChunk(u, includeUsage)
        )
      }
    }
  }
  const tokPre = `data: ${head}[{"index":0,"text":`
  const tokPost = `,"logprobs":null,"finish_reason":null${tokenStop}}]`
  return {
    first: "",
    token: (t, at) =>
      t === "" && skipEmpty ? "" : `${tokPre}${JSON.stringify(t)}${tokPost}${chunkUsage(at?.usage, perChunk)}}\n\n`,
    finishWithLastToken,
    end: (r, u, includeUsage, last, _index, matched) =>
      `data: ${head}[{"index":0,"text":${JSON.stringify(last ?? "")},"logprobs":null,"finish_reason":${JSON.stringify(r)}${stopOf(stopValue(flavor, r, matched))}}]${chunkUsage(u, perChunk)}}\n\n` +
      usageChunk(u, includeUsage)
  }
}

/** The non-streaming response object. */
export const fullBody = (
  flavor: Exclude<Flavor, "llama_cpp">,
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  end: { readonly content: string; readonly reason: string; readonly matched: string | undefined },
  usage: Usage,
  kvTransferParams: unknown,
  prompt: MlxPrompt = NO_OPTS
): Record<string, unknown> => {
  if (flavor === "mlx") return mlxFullBody(endpoint, id, model, created, end, usage, prompt)
  const field = STOP_SHAPES[flavor].field
  const stop = field === undefined ? {} : { [field]: stopValue(flavor, end.reason, end.matched) }
  const text = end.content
  const choice =
    endpoint === "chat"
      ? {
          index: 0,
          // SGLang's ChatMessage is dumped whole: its unset reasoning and tool calls are nulls (protocol.py)
          message:
            flavor === "sglang"
              ? { role: "assistant", content: text, reasoning_content: null, tool_calls: null }
              : { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: end.reason,
          ...stop
        }
      : { index: 0, text, logprobs: null, finish_reason: end.reason, ...stop }
  const body: Record<string, unknown> = {
    id,
    object: endpoint === "chat" ? "chat.completion" : "text_completion",
    created,
    model,
    choices: [choice],
    usage: JSON.parse(usageJson(flavor, usage)) as unknown
  }
  if (flavor === "vllm") body.kv_transfer_params = kvTransferParams ?? null
  return body
}

/** GET /v1/models per flavor; `slotContext`: llama.cpp's one slot's context (SimConfig.slotContext). */
export const modelsBody = (
  flavor: Flavor,
  servedName: string,
  model: string,
  maxModelLen: number | undefined,
  created: number,
  slotContext?: number
): unknown => {
  const entry: Record<string, unknown> = { id: servedName, object: "model", created, owned_by: owner(flavor) }
  if (flavor === "vllm") {
    Object.assign(entry, { root: model, parent: null, max_model_len: maxModelLen ?? SIM_MODEL_CONTEXT, permission: [] })
  } else if (flavor === "sglang") {
    Object.assign(entry, { root: servedName, max_model_len: maxModelLen ?? SIM_MODEL_CONTEXT })
  } else if (flavor === "llama_cpp") {
    // tools/server/server-context.cpp get_res_models / get_res_model_info: `n_ctx` is a slot's (meta.slot_n_ctx,
    // n_ctx_slot()), `vocab_type` the bundled build writes as a boolean (measured: test/real/sim-differential.test.ts);
    // the other meta numbers are placeholders.
    const ctx = maxModelLen ?? 4096
    const meta = {
      vocab_type: true,
      n_vocab: 32000,
      n_ctx: slotContext ?? ctx,
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
