// What the engine simulator runs with: the flavor it imitates and every knob, as parsed from its command
// line by args.ts (pure types; the one error parsing throws).
import type { ApiKeySource } from "./apiKey.ts"
import type { LoadBalanceMethod } from "./dpController.ts"
import type { LlamaContextArgs } from "./llamaContext.ts"
import type { PrefillLoss } from "./pd.ts"
import type { SglangHealth } from "./sglangHealth.ts"
import type { SpmVocab } from "./spmVocab.ts"
import type { StartFailure } from "./startFailures.ts"

export type Flavor = "vllm" | "sglang" | "llama_cpp" | "mlx"
export type SimMode = "echo" | "random"
/** `sse_error_field`: older llama.cpp's `error: {...}` line then `data: [DONE]` (other flavors: as midstream). */
export type ErrorKind = "http400" | "http404" | "http429" | "http500" | "midstream" | "sse_error_field" | "reset"

export interface SimConfig {
  readonly flavor: Flavor
  readonly host: string
  readonly port: number
  /** Model as given (HF id, path, GGUF file). */
  readonly model: string
  /** Name in /v1/models, responses and the model_name label. */
  readonly servedName: string
  readonly maxModelLen: number | undefined
  /**
   * SGLang `--allow-auto-truncate`: a prompt too long for the context is cut to it and max_tokens cut to what is left,
   * each with a warning, instead of refused (contextLimit.ts).
   */
  readonly allowAutoTruncate?: boolean
  /**
   * llama_cpp: the context of one slot. An explicit `-np N` splits `-c` over N slots; with -np unset the
   * server picks 4 slots over one unified KV cache, so each may use all of it (tools/server/server.cpp).
   */
  readonly slotContext: number | undefined
  /** llama_cpp: the context flags a slot's context comes from, with the model's training context (llamaContext.ts). */
  readonly llamaContext?: LlamaContextArgs | undefined
  /** llama_cpp: the model file's training context (ggufMeta.ts), when the file could be read. */
  readonly nCtxTrain?: number | undefined
  /** llama_cpp: the `-m`/`--model` file, which the load checks (modelFile.ts); undefined with -hf or neither. */
  readonly llamaModelFile?: string | undefined
  /** llama_cpp: `--fit` (`LLAMA_ARG_FIT`), on unless set off (common/arg.cpp is_falsey). */
  readonly llamaFit?: boolean | undefined
  /** llama_cpp: the model file's llama SentencePiece vocabulary (spmVocab.ts), which counts a prompt's tokens. */
  readonly vocab?: SpmVocab | undefined
  readonly tensorParallel: number
  /** vLLM `--data-parallel-size`, SGLang `--dp-size`: ranks, each with its scheduler, KV cache and publisher. */
  readonly dataParallel: number
  /** SGLang: how its DataParallelController routes between the ranks (`--load-balance-method`, resolved). */
  readonly loadBalanceMethod: LoadBalanceMethod | undefined
  readonly enableMetrics: boolean
  readonly kvTransferConfig: Record<string, unknown> | undefined
  readonly kvEventsConfig: Record<string, unknown> | undefined
  readonly disaggregationMode: "prefill" | "decode" | undefined
  readonly bootstrapPort: number
  readonly mode: SimMode
  readonly seed: number
  readonly ttftMs: number
  readonly itlMs: number
  readonly maxSeqs: number
  readonly startupDelayMs: number
  /**
   * SGLang: how long /health answers 503 after the HTTP server is up, while SGLang's warm-up request runs
   * (--sim-warmup; python/sglang/srt/entrypoints/http_server.py _wait_and_warmup). Its model loads before the server
   * listens (launch_server: _launch_subprocesses, then uvicorn), which --sim-startup-delay stands for, as vLLM's.
   */
  readonly warmupMs: number
  /** How long the graceful shutdown after the first SIGTERM/SIGINT takes (--sim-shutdown-delay, default 200ms). */
  readonly shutdownDelayMs: number
  readonly blockSize: number
  readonly kvBlocks: number
  /**
   * A request's max_tokens where it names none: vLLM's and SGLang's CompletionRequest default (16), mlx-lm's
   * --max-tokens (512), or --sim-default-max-tokens. A vLLM or SGLang chat takes its engine's own (contextLimit.ts
   * unnamedMaxTokens) unless that knob is given.
   */
  readonly defaultMaxTokens: number
  /** --sim-default-max-tokens where given: a chat without max_tokens gets it too. */
  readonly simDefaultMaxTokens?: number | undefined
  readonly crashAfterRequests: number | undefined
  readonly crashAfterMs: number | undefined
  /** Dies while loading (after --sim-startup-delay) of this cause, as the flavor's engine does (startFailures.ts). */
  readonly crashAtStart: StartFailure | undefined
  readonly stallAfterTokens: number | undefined
  /**
   * llama_cpp: `--sse-ping-interval` in ms (default 30 s; -1 or 0: off): a stream that has sent its first chunk
   * and then has nothing to send for this long gets an SSE comment (`:`) instead.
   */
  readonly ssePingMs: number | undefined
  /** llama_cpp: `--slot-prompt-similarity` (default 0.1; 0: off), how a task's slot is picked (llamaSlots.ts). */
  readonly slotPromptSimilarity?: number | undefined
  readonly ignoreSigterm: boolean
  readonly forkGrandchild: boolean
  readonly errorRate: number
  readonly errorKind: ErrorKind
  readonly kvStopAfter: number | undefined
  readonly kvSkipSeq: number | undefined
  readonly hangHealth: boolean
  /** SGLang: how its `/health` answers (sglangHealth.ts, from the environment); other flavors: undefined. */
  readonly sglangHealth: SglangHealth | undefined
  /** llama_cpp: answer /models and /v1/models 200 (`"meta": null`) while loading, as newer llama-server builds do. */
  readonly modelsWhileLoading: boolean
  readonly kvLegacyArrays: boolean
  /**
   * vLLM before 0.10.1 (PR #22099): flat `{"object":"error",...}` error bodies, `{"error":{"object":"error",...}}`
   * mid-stream and the older context-length words (--sim-legacy-errors; other flavors: no effect).
   */
  readonly legacyErrors: boolean
  /** vLLM before PR #29665: P sends no remote_request_id, D pulls under its own request id. */
  readonly nixlLegacy: boolean
  /** vLLM < 0.26 replay replies (3 frames, no topic). */
  readonly kvReplay3Frames: boolean
  readonly kvLeaseMs: number | undefined
  readonly bootstrapTimeoutMs: number | undefined
  /** SGLang decode: when a prefill that cannot be reached fails the request (pd.ts PrefillLoss). */
  readonly prefillLoss: PrefillLoss
  /** Where the engine's API keys come from (apiKey.ts): flags, environment, key files. */
  readonly apiKeySources: ReadonlyArray<ApiKeySource>
  /**
   * The API keys a request must carry one of (none: no check): those given directly; src/programs/sim.ts adds the
   * key files' at start (apiKey.ts loadApiKeys).
   */
  readonly apiKeys: ReadonlyArray<string>
  /** Flags seen on the line that the simulator accepts but does not model. */
  readonly unmodelled: ReadonlyArray<string>
  /** --sim-strict-args: an unmodelled flag is refused as the engine's parser refuses a flag it does not know. */
  readonly strictArgs: boolean
  /**
   * --sim-sigterm-waits-streams: on SIGTERM the streams in flight stall and the process waits for their clients to
   * leave (at most 30 s) before it exits, as llama-server often does (ggml-org/llama.cpp#18237).
   */
  readonly sigtermWaitsStreams: boolean
}

export class ArgsError extends Error {}
