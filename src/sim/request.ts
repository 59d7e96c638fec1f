// Validation of OpenAI request bodies (pure), per flavor: what real engines reject with 400/404, and the
// prompt words the simulator echoes. Returns either the normalised request or an HTTP status + message.

import type { Endpoint, Usage } from "./chunks.ts"
import { contextFit, unnamedMaxTokens } from "./contextLimit.ts"
import { bodyDpRank } from "./dpPin.ts"
import type { LlamaOut } from "./llamaOut.ts"
import { validateLlama } from "./llamaValidate.ts"
import { earlyRefusal, greedySampling, type Invalid, samplingRefusal } from "./requestChecks.ts"
import { sglangScheduler } from "./sglangSchedulerBound.ts"
import type { SimConfig } from "./simConfig.ts"
import { words } from "./tokens.ts"
import {
  missingMessages,
  notAnObject,
  sglangFieldRefusal,
  sglangRequestRefusal,
  sglangRoleRefusal,
  vllmBuiltRefusal
} from "./upstreamRefusals.ts"

/**
 * The bootstrap host SGLang's own warm-up and /health_generate send a prefill or decode server for a request with
 * no peer: it gets the fake KV sender or receiver, which report the hand-off done at once
 * (FAKE_BOOTSTRAP_HOST, python/sglang/srt/disaggregation/utils.py; http_server.py _execute_server_warmup and
 * health_generate; decode.py and prefill.py, the bootstrap queues' `add`; fake/conn.py).
 */
export const FAKE_BOOTSTRAP_HOST = "2.2.2.2"

/** One sequence the request generates: llama-server makes one per prompt and per `n`; the others one. */
export interface Sequence {
  readonly words: ReadonlyArray<string>
  /** The prompt's length in tokens as the engine reports it (llama-server: with its BOS). */
  readonly promptTokens: number
  /** llama.cpp: the prompt's tokens (promptTokens of them) as its slot holds them: its BOS, a chat's template. */
  readonly tokens?: ReadonlyArray<string>
  readonly maxTokens: number
  readonly seed: number | undefined
}

export interface GenRequest {
  readonly endpoint: Endpoint
  /** The prompt as the engine counts and caches it: its words (llama.cpp: its first prompt's tokens). */
  readonly promptWords: ReadonlyArray<string>
  readonly maxTokens: number
  readonly stream: boolean
  readonly includeUsage: boolean
  readonly seed: number | undefined
  /** Greedy sampling (requestChecks.ts greedySampling): its text is the prompt's own, whatever the seed. */
  readonly greedy?: boolean
  /** vLLM/SGLang `cache_salt`: the prompt's KV blocks hash apart from other salts'. */
  readonly cacheSalt: string | undefined
  readonly kvTransferParams: Record<string, unknown> | undefined
  /** `ignore_eos` (vLLM, SGLang and llama.cpp sampling; mlx-lm has none): generate to max_tokens. */
  readonly ignoreEos: boolean
  /**
   * SGLang P/D bootstrap fields. `fake`: the bootstrap host is SGLang's FAKE_BOOTSTRAP_HOST (a port is then not
   * needed), which its own warm-up and /health_generate send: served with no peer (pdLegs.ts).
   */
  readonly bootstrap:
    | { readonly fake: false; readonly host: string; readonly port: number; readonly room: string }
    | { readonly fake: true; readonly room: string }
    | undefined
  /**
   * SGLang `routed_dp_rank` (or the deprecated `data_parallel_rank` in its stead): the data-parallel rank the client
   * names (dpPin.ts). An integer or a string of one, as pydantic's int takes it; any other value is not modelled.
   */
  readonly routedDpRank?: number | undefined
  /** SGLang: the request's `model`, which its answer carries whatever it names (serving_chat.py `model=request.model`). */
  readonly echoModel?: string
  /** Lines the engine logs at warning level as it takes the request (SGLang's auto-truncation, contextLimit.ts). */
  readonly warnings?: ReadonlyArray<string>
  /** llama.cpp: a trailing assistant message's text, which the answer starts with (llamaRequest.ts). */
  readonly assistantPrefill?: string
  /** What is generated: one sequence, or (llama.cpp) prompts × `n`, answered as choices 0, 1, ... */
  readonly sequences: ReadonlyArray<Sequence>
  /** Stop strings; each engine finds and cuts them its own way (stopRules.ts, llama.cpp: sequences.ts). */
  readonly stop: ReadonlyArray<string>
  /** vLLM `include_stop_str_in_output`: the stop string stays in the text. */
  readonly includeStopStr?: boolean
  /** SGLang `no_stop_trim`: the stop string stays in the text. */
  readonly noStopTrim?: boolean
  /** `usage` on every stream chunk (`stream_options.continuous_usage_stats`, as the flavor reads it). */
  readonly continuousUsage?: boolean
  /** llama.cpp: SSE comment pings while a started stream has nothing to send (ms; undefined: none). */
  readonly ssePingMs?: number | undefined
  /** llama.cpp: what its chunks carry beyond the text (logprobs, per-token timings, each task's begin). */
  readonly llama?: LlamaOut
}

export type { Invalid }

const contentText = (content: unknown): string => {
  if (typeof content === "string") return content
  if (Array.isArray(content)) {
    return content
      .map((p: unknown) =>
        typeof p === "object" && p !== null && typeof (p as { text?: unknown }).text === "string"
          ? (p as { text: string }).text
          : ""
      )
      .join(" ")
  }
  return ""
}

const promptText = (prompt: unknown): string | undefined => {
  if (typeof prompt === "string") return prompt
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((x) => typeof x === "number")) return prompt.join(" ")
    const first: unknown = prompt[0]
    if (typeof first === "string") return first
    if (Array.isArray(first)) return first.join(" ")
  }
  return undefined
}

const isString = (v: unknown): v is string => typeof v === "string"

/**
 * vLLM's SamplingParams._verify_args on max_tokens (vllm-project/vllm vllm/sampling_params.py): a
 * VLLMValidationError naming parameter and value, which its str() appends (vllm/exceptions.py).
 */
const vllmMaxTokens = (rawMax: unknown): string =>
  typeof rawMax === "number" && Number.isInteger(rawMax)
    ? `max_tokens must be at least 1, got ${rawMax}. (parameter=max_tokens, value=${rawMax})`
    : `max_tokens must be at least 1, got ${String(rawMax)}.`

/** Validates a parsed body; `rawBody` lets bootstrap_room (up to 2^63-1) be read without float rounding. */
export const validate = (cfg: SimConfig, endpoint: Endpoint, body: unknown, rawBody: string): GenRequest | Invalid => {
  if (cfg.flavor === "llama_cpp") return validateLlama(cfg, endpoint, body)
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    if (cfg.flavor === "mlx") return { status: 400, message: "request body must be a JSON object", param: null }
    return { ...notAnObject(cfg.flavor, body), param: null }
  }
  const b = body as Record<string, unknown>
  const early = earlyRefusal(cfg, endpoint, b, rawBody)
  if (early !== undefined) return early
  // pydantic's required field, checked before any handler code runs (the model's name among it)
  if (endpoint === "chat" && b.messages === undefined && cfg.flavor !== "mlx")
    return { ...missingMessages(cfg.flavor, b), param: null }
  const badRole = cfg.flavor === "sglang" && endpoint === "chat" ? sglangRoleRefusal(b) : undefined
  if (badRole !== undefined) return { ...badRole, param: null }
  const model = b.model
  if (model !== undefined && model !== null && typeof model === "string") {
    // SGLang's OpenAI routes never compare the name (python/sglang/srt/entrypoints/openai/serving_base.py
    // handle_request: "intended, the model field is only for compatibility", sgl-project/sglang#4293; #31404):
    // any name is served and echoed in the answer's `model`.
    const known =
      model === cfg.servedName ||
      (cfg.flavor === "mlx" && (model === cfg.model || model === "default_model")) ||
      cfg.flavor === "sglang"
    if (!known) {
      const message =
        cfg.flavor === "mlx"
          ? `Failed to load model ${model}: repository not found`
          : `The model \`${model}\` does not exist.`
      return { status: 404, message, param: "model" }
    }
  }
  const rawMax = b.max_completion_tokens ?? b.max_tokens
  // SGLang's CompletionRequest refuses max_tokens <= 0 as it parses the body, before its handler's checks
  if (cfg.flavor === "sglang" && endpoint === "completion" && typeof b.max_tokens === "number" && b.max_tokens <= 0)
    return { ...sglangFieldRefusal("max_tokens", "max_tokens must be positive", b.max_tokens), param: null }
  let text: string
  // SGLang's handler checks the request before anything else (upstreamRefusals.ts)
  const sglangRefusal = cfg.flavor === "sglang" ? sglangRequestRefusal(cfg, endpoint, b) : undefined
  if (sglangRefusal !== undefined) return { status: 400, message: sglangRefusal, param: null }
  if (endpoint === "chat") {
    if (!Array.isArray(b.messages) || b.messages.length === 0) {
      return { status: 400, message: "messages: field required (a non-empty list)", param: "messages" }
    }
    text = b.messages
      .map((m: unknown) =>
        typeof m === "object" && m !== null ? contentText((m as { content?: unknown }).content) : ""
      )
      .join(" ")
  } else {
    const t = promptText(b.prompt)
    if (t === undefined) return { status: 400, message: "prompt: field required", param: "prompt" }
    text = t
  }
  const allWords = words(text)
  // a request naming no max_tokens: its engine's default for the endpoint (contextLimit.ts)
  const unnamed = unnamedMaxTokens(cfg, endpoint, allWords.length)
  let maxTokens = unnamed.maxTokens
  let maxRefusal: Invalid | undefined
  const named = rawMax !== undefined && rawMax !== null
  if (named) {
    // mlx-lm and SGLang's chat take 0: only SGLang's CompletionRequest refuses it (openai/protocol.py
    // validate_max_tokens_positive); a chat's goes to SamplingParams.verify (sampling/sampling_params.py)
    const sglangChat = cfg.flavor === "sglang" && endpoint !== "completion"
    const least = cfg.flavor === "mlx" || sglangChat ? 0 : 1
    if (typeof rawMax !== "number" || !Number.isInteger(rawMax) || rawMax < least) {
      const message = sglangChat
        ? `max_new_tokens must be at least 0, got ${String(rawMax)}.`
        : cfg.flavor === "sglang"
          ? "max_tokens must be positive"
          : vllmMaxTokens(rawMax)
      maxRefusal = { status: 400, message, param: "max_tokens" }
      // vLLM's is one of _verify_args' checks, after the context's and the sampling fields' (below)
      if (cfg.flavor !== "vllm") return maxRefusal
    } else maxTokens = rawMax
  }
  const fit = contextFit(
    cfg.flavor,
    cfg.maxModelLen,
    allWords.length,
    maxRefusal === undefined && (named || unnamed.checked) ? maxTokens : undefined,
    cfg.legacyErrors,
    cfg.allowAutoTruncate === true
  )
  if ("message" in fit) return { status: 400, ...fit }
  // SGLang with --allow-auto-truncate keeps the prompt's first tokens and cuts max_tokens to what is left
  let promptWords = fit.keep < allWords.length ? allWords.slice(0, fit.keep) : allWords
  if (fit.maxTokens !== undefined) maxTokens = fit.maxTokens
  const sampling = samplingRefusal(cfg, b) ?? maxRefusal
  if (sampling !== undefined) return sampling
  // `stop` is a string or a list of strings for all three (vLLM and SGLang protocol.py, mlx_lm/server.py
  // do_POST). vLLM refuses an empty one (vllm/sampling_params.py SamplingParams._verify_args, answered 400).
  const stop = typeof b.stop === "string" ? [b.stop] : Array.isArray(b.stop) ? b.stop.filter(isString) : []
  if (cfg.flavor === "vllm" && stop.includes("")) {
    return { status: 400, message: "stop cannot contain an empty string.", param: null }
  }
  const built = cfg.flavor === "vllm" ? vllmBuiltRefusal(endpoint, b) : undefined
  if (built !== undefined) return { status: 400, ...built }
  const so = b.stream_options
  const includeUsage =
    typeof so === "object" && so !== null && (so as { include_usage?: unknown }).include_usage === true
  const continuousStats =
    typeof so === "object" &&
    so !== null &&
    (so as { continuous_usage_stats?: unknown }).continuous_usage_stats === true
  const kvp = b.kv_transfer_params
  let bootstrap: GenRequest["bootstrap"]
  const roomMatch = /"bootstrap_room"\s*:\s*(\d+)/.exec(rawBody)
  if (b.bootstrap_host === FAKE_BOOTSTRAP_HOST && roomMatch !== null) {
    bootstrap = { fake: true, room: roomMatch[1] ?? "" }
  } else if (typeof b.bootstrap_host === "string" && b.bootstrap_port !== undefined && roomMatch !== null) {
    bootstrap = { fake: false, host: b.bootstrap_host, port: Number(b.bootstrap_port), room: roomMatch[1] ?? "" }
  }
  const seed = typeof b.seed === "number" ? b.seed : undefined
  // SGLang's scheduler bounds the request again once the tokenizer manager's checks have passed it
  const sched = cfg.flavor === "sglang" ? sglangScheduler(cfg, promptWords.length, maxTokens) : undefined
  if (sched !== undefined && "abort" in sched)
    return { status: 400, message: sched.abort, param: null, schedulerAbort: { stream: b.stream === true } }
  if (sched !== undefined) {
    promptWords = promptWords.slice(0, sched.keep)
    maxTokens = sched.maxTokens
  }
  const warnings = [...fit.warnings, ...(sched?.warnings ?? [])]
  return {
    endpoint,
    promptWords,
    maxTokens,
    stream: b.stream === true,
    includeUsage,
    // usage on every chunk: vLLM only with include_usage (vllm/entrypoints/utils.py should_include_usage), SGLang
    // without it too (python/sglang/srt/entrypoints/openai/utils.py should_include_usage); mlx-lm has no such option
    continuousUsage: continuousStats && (cfg.flavor === "sglang" || (cfg.flavor === "vllm" && includeUsage)),
    seed,
    greedy: greedySampling(cfg, b),
    cacheSalt: typeof b.cache_salt === "string" && b.cache_salt !== "" ? b.cache_salt : undefined,
    kvTransferParams: typeof kvp === "object" && kvp !== null ? (kvp as Record<string, unknown>) : undefined,
    ignoreEos: cfg.flavor !== "mlx" && b.ignore_eos === true,
    bootstrap,
    sequences: [{ words: promptWords, promptTokens: promptWords.length, maxTokens, seed }],
    stop,
    includeStopStr: cfg.flavor === "vllm" && b.include_stop_str_in_output === true,
    noStopTrim: cfg.flavor === "sglang" && b.no_stop_trim === true,
    routedDpRank: bodyDpRank(cfg.flavor, b),
    ...(warnings.length > 0 ? { warnings } : {}),
    ...(cfg.flavor === "sglang" && typeof b.model === "string" ? { echoModel: b.model } : {})
  }
}

/** One sequence's usage: its prompt's tokens and `generated`. */
export const sequenceUsage = (gr: GenRequest, index: number, generated: number): Usage => {
  const p = gr.sequences[index]?.promptTokens ?? 0
  return { prompt_tokens: p, total_tokens: p + generated, completion_tokens: generated }
}

export const isInvalid = (r: GenRequest | Invalid): r is Invalid => "status" in r
