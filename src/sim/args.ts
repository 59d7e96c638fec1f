// Command-line parsing of the engine simulator (pure: no I/O).
// It accepts each engine's own flags as the renderers emit them (tables: flagTables.ts), plus the --sim-*
// knobs of the brief, and picks the flavor from --flavor or the first words (commandLine.ts). Flags it does
// not model are collected for one log line.
import { apiKeySources } from "./apiKey.ts"
import { detectFlavor, num, parseDuration, parseJsonFlag, tokenize } from "./commandLine.ts"
import { resolveLoadBalanceMethod } from "./dpController.ts"
import { DEFAULT_PORT, ERROR_KINDS, MODELLED } from "./flagTables.ts"
import { type LlamaContextArgs, llamaSlotContext } from "./llamaContext.ts"
import { prefillLossOf } from "./pd.ts"
import { sglangHealthOf } from "./sglangHealth.ts"
import { ArgsError, type ErrorKind, type Flavor, type SimConfig } from "./simConfig.ts"
import { START_FAILURES, type StartFailure } from "./startFailures.ts"

const KVBM_TIERS = [
  "DYN_KVBM_CPU_CACHE_GB",
  "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS",
  "DYN_KVBM_DISK_CACHE_GB",
  "DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS"
]

/**
 * Dynamo's KVBM leader refuses to start without a CPU or disk cache tier ("KVBM Configuration Error: At least
 * one cache tier must be configured", ai-dynamo/dynamo KVBM leader), so vLLM with the DynamoConnector dies.
 */
const checkKvbmTiers = (env: Record<string, string | undefined>): void => {
  const sized = KVBM_TIERS.some((k) => {
    const n = Number(env[k] ?? "")
    return Number.isFinite(n) && n > 0
  })
  if (!sized)
    throw new ArgsError(
      `KVBM Configuration Error: At least one cache tier must be configured (${KVBM_TIERS.join(", ")})`
    )
}

/** --sim-crash-at-start: one of the causes the flavor's engine is known to die of at start. */
const crashAtStartOf = (flavor: Flavor, cause: string | undefined): StartFailure | undefined => {
  if (cause === undefined) return undefined
  const known = Object.keys(START_FAILURES[flavor])
  if (!known.includes(cause))
    throw new ArgsError(`--sim-crash-at-start: ${cause}; ${flavor} knows ${known.join(", ") || "none"}`)
  return cause as StartFailure
}

/** Parses the simulator's command line. Throws ArgsError on malformed knobs. */
export const parseArgs = (argv: ReadonlyArray<string>, env: Record<string, string | undefined> = {}): SimConfig => {
  const { flavor, rest } = detectFlavor(argv)
  const p = tokenize(rest)
  const v = (n: string) => p.values.get(n)
  const first = (...names: Array<string>) => names.map(v).find((x) => x !== undefined)
  const dur = (n: string) => {
    const t = v(n)
    return t === undefined ? undefined : parseDuration(t)
  }

  let model: string
  let servedName: string
  let maxModelLen: number | undefined
  let slotContext: number | undefined
  let llamaContext: LlamaContextArgs | undefined
  let llamaModelFile: string | undefined
  let llamaFit: boolean | undefined
  let ssePingMs: number | undefined
  let slotPromptSimilarity: number | undefined
  let tensorParallel = 1
  let dataParallel = 1
  let enableMetrics = true
  let defaultMaxSeqs = 256
  let blockSize = 16
  // A completion without max_tokens: vLLM's and SGLang's CompletionRequest default to 16 (vllm-project/vllm
  // vllm/entrypoints/openai/completion/protocol.py, sgl-project/sglang python/sglang/srt/entrypoints/openai/
  // protocol.py); mlx-lm's is its --max-tokens (below). Their chats: contextLimit.ts unnamedMaxTokens.
  let defaultMaxTokens = 16
  if (flavor === "vllm") {
    const positional = p.positional[0] === "serve" ? p.positional[1] : p.positional[0]
    model = first("--model") ?? positional ?? "facebook/opt-125m"
    servedName = v("--served-model-name") ?? model
    maxModelLen = num(v("--max-model-len"), "--max-model-len")
    tensorParallel = num(first("--tensor-parallel-size", "-tp"), "--tensor-parallel-size") ?? 1
    dataParallel = num(first("--data-parallel-size", "-dp"), "--data-parallel-size") ?? 1
    defaultMaxSeqs = num(v("--max-num-seqs"), "--max-num-seqs") ?? 256
    // Without --block-size vLLM takes the platform's/model's choice (vllm/config/cache.py; 16 on CUDA,
    // larger for some attention backends): --sim-platform-block-size stands for that choice.
    blockSize =
      num(v("--block-size"), "--block-size") ?? num(v("--sim-platform-block-size"), "--sim-platform-block-size") ?? 16
  } else if (flavor === "sglang") {
    model = first("--model-path", "--model") ?? "default"
    servedName = v("--served-model-name") ?? model
    maxModelLen = num(v("--context-length"), "--context-length")
    tensorParallel = num(first("--tp-size", "--tensor-parallel-size", "--tp"), "--tp-size") ?? 1
    dataParallel = num(first("--dp-size", "--data-parallel-size", "--dp"), "--dp-size") ?? 1
    enableMetrics = p.flags.has("--enable-metrics")
    defaultMaxSeqs = num(v("--max-running-requests"), "--max-running-requests") ?? 256
    blockSize = num(v("--page-size"), "--page-size") ?? 1
  } else if (flavor === "llama_cpp") {
    model = first("-m", "--model", "-hf", "--hf-repo") ?? "model.gguf"
    const base = model.split("/").pop() ?? model
    servedName = first("-a", "--alias") ?? (first("-m", "--model") !== undefined ? base : model)
    maxModelLen = num(first("-c", "--ctx-size"), "-c")
    enableMetrics = p.flags.has("--metrics")
    const np = num(first("-np", "--parallel"), "-np")
    defaultMaxSeqs = np ?? 4
    // A slot's context as llama.cpp pads and splits it (llamaContext.ts); the model's training context, which
    // caps it, is read from the model file at start (context.ts makeContext).
    llamaContext = { ctx: maxModelLen, parallel: np, unified: p.flags.has("--kv-unified") || p.flags.has("-kvu") }
    slotContext = llamaSlotContext(llamaContext, undefined)
    llamaModelFile = first("-m", "--model")
    const fit = first("-fit", "--fit") ?? env.LLAMA_ARG_FIT
    llamaFit = fit === undefined || !["off", "disabled", "false", "0"].includes(fit)
    // common/common.h sse_ping_interval = 30 (seconds; -1 disables), common/arg.cpp --sse-ping-interval.
    const ping = num(v("--sse-ping-interval"), "--sse-ping-interval") ?? 30
    ssePingMs = ping > 0 ? ping * 1000 : undefined
    // common/common.h slot_prompt_similarity = 0.1 (common/arg.cpp -sps: std::stof)
    slotPromptSimilarity = num(first("-sps", "--slot-prompt-similarity"), "--slot-prompt-similarity") ?? 0.1
  } else {
    model = v("--model") ?? "mlx-community/model"
    servedName = model
    defaultMaxSeqs = num(v("--decode-concurrency"), "--decode-concurrency") ?? 32
    // mlx-lm's completion length for a request that names none (max_completion_tokens, then max_tokens, then
    // this; default 512): ml-explore/mlx-lm mlx_lm/server.py, do_POST and main's `--max-tokens`.
    defaultMaxTokens = num(v("--max-tokens"), "--max-tokens") ?? 512
  }
  if (maxModelLen === 0) maxModelLen = undefined

  const modelled = new Set(MODELLED[flavor])
  const unmodelled = [...p.values.keys(), ...p.flags, ...p.dotted.keys()].filter(
    (f) => !f.startsWith("--sim-") && !modelled.has(f)
  )

  const mode = v("--sim-mode") ?? "echo"
  if (mode !== "echo" && mode !== "random") throw new ArgsError(`--sim-mode: ${mode}`)
  const errorKind = v("--sim-error-kind") ?? "http500"
  if (!ERROR_KINDS.includes(errorKind as ErrorKind)) throw new ArgsError(`--sim-error-kind: ${errorKind}`)
  const disagg = v("--disaggregation-mode")
  // SGLang's decode server forces disable_radix_cache unless told otherwise, and then refuses the hierarchical
  // cache (python/sglang/srt/server_args.py).
  if (
    flavor === "sglang" &&
    disagg === "decode" &&
    p.flags.has("--enable-hierarchical-cache") &&
    !p.flags.has("--disaggregation-decode-enable-radix-cache")
  )
    throw new ArgsError(
      "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot be used at the same time. Please use only one of them."
    )
  const kvTransferConfig = flavor === "vllm" ? parseJsonFlag(p, "--kv-transfer-config") : undefined
  if (kvTransferConfig?.kv_connector === "DynamoConnector") checkKvbmTiers(env)
  // Prefill: how long a request may wait for its decode side to connect; decode: for the KV to arrive.
  const envTimeout =
    disagg === "prefill" ? env.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT : env.SGLANG_DISAGGREGATION_WAITING_TIMEOUT
  const bootstrapTimeoutMs =
    dur("--sim-bootstrap-timeout") ?? (envTimeout !== undefined ? Number(envTimeout) * 1000 : undefined)
  const keySources = apiKeySources(flavor, rest, env)

  return {
    flavor,
    host: v("--host") ?? (flavor === "vllm" ? "0.0.0.0" : "127.0.0.1"),
    port: num(v("--port"), "--port") ?? DEFAULT_PORT[flavor],
    model,
    servedName,
    maxModelLen,
    // a store_true flag of SGLang's ServerArgs (python/sglang/srt/server_args.py)
    allowAutoTruncate: flavor === "sglang" && p.flags.has("--allow-auto-truncate"),
    slotContext,
    llamaContext,
    llamaModelFile,
    llamaFit,
    tensorParallel,
    dataParallel,
    // argparse checks the choices whatever --dp-size is (python/sglang/srt/server_args.py).
    loadBalanceMethod: flavor === "sglang" ? resolveLoadBalanceMethod(v("--load-balance-method"), disagg) : undefined,
    enableMetrics,
    kvTransferConfig,
    kvEventsConfig: flavor === "vllm" || flavor === "sglang" ? parseJsonFlag(p, "--kv-events-config") : undefined,
    disaggregationMode: disagg === "prefill" || disagg === "decode" ? disagg : undefined,
    bootstrapPort: num(v("--disaggregation-bootstrap-port"), "--disaggregation-bootstrap-port") ?? 8998,
    mode,
    seed: num(v("--sim-seed"), "--sim-seed") ?? 0,
    ttftMs: dur("--sim-ttft") ?? 0,
    itlMs: dur("--sim-itl") ?? 0,
    maxSeqs: num(v("--sim-max-seqs"), "--sim-max-seqs") ?? defaultMaxSeqs,
    startupDelayMs: dur("--sim-startup-delay") ?? 0,
    warmupMs: dur("--sim-warmup") ?? 0,
    shutdownDelayMs: dur("--sim-shutdown-delay") ?? 200,
    blockSize: num(v("--sim-block-size"), "--sim-block-size") ?? blockSize,
    kvBlocks: num(v("--sim-kv-blocks"), "--sim-kv-blocks") ?? 4096,
    defaultMaxTokens: num(v("--sim-default-max-tokens"), "--sim-default-max-tokens") ?? defaultMaxTokens,
    simDefaultMaxTokens: num(v("--sim-default-max-tokens"), "--sim-default-max-tokens"),
    crashAfterRequests: num(v("--sim-crash-after-requests"), "--sim-crash-after-requests"),
    crashAfterMs: dur("--sim-crash-after"),
    crashAtStart: crashAtStartOf(flavor, v("--sim-crash-at-start")),
    stallAfterTokens: num(v("--sim-stall-after-tokens"), "--sim-stall-after-tokens"),
    ssePingMs,
    slotPromptSimilarity,
    ignoreSigterm: p.flags.has("--sim-ignore-sigterm"),
    strictArgs: p.flags.has("--sim-strict-args"),
    // llama-server's own way (src/programs/sim.ts shutdown), so its flavor's default
    sigtermWaitsStreams: flavor === "llama_cpp" || p.flags.has("--sim-sigterm-waits-streams"),
    forkGrandchild: p.flags.has("--sim-fork-grandchild"),
    errorRate: num(v("--sim-error-rate"), "--sim-error-rate") ?? 0,
    errorKind: errorKind as ErrorKind,
    kvStopAfter: num(v("--sim-kv-stop-after"), "--sim-kv-stop-after"),
    kvSkipSeq: num(v("--sim-kv-skip-seq"), "--sim-kv-skip-seq"),
    hangHealth: p.flags.has("--sim-hang-health"),
    sglangHealth: flavor === "sglang" ? sglangHealthOf(env) : undefined,
    modelsWhileLoading: p.flags.has("--sim-models-while-loading"),
    kvLegacyArrays: p.flags.has("--sim-kv-legacy-arrays"),
    legacyErrors: p.flags.has("--sim-legacy-errors"),
    nixlLegacy: p.flags.has("--sim-nixl-legacy"),
    kvReplay3Frames: p.flags.has("--sim-kv-replay-3-frames"),
    kvLeaseMs: dur("--sim-kv-lease"),
    bootstrapTimeoutMs,
    prefillLoss: prefillLossOf(env),
    apiKeySources: keySources,
    apiKeys: keySources.flatMap((s) => ("keys" in s ? s.keys : [])),
    unmodelled
  }
}
