// Command-line parsing of the engine simulator (pure: no I/O).
// It accepts each engine's own flags as the renderers emit them, plus the --sim-* knobs of the brief, and
// picks the flavor from --flavor or the first words. Flags it does not model are collected for one log line.
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
   * llama_cpp: the context of one slot. An explicit `-np N` splits `-c` over N slots; with -np unset the
   * server picks 4 slots over one unified KV cache, so each may use all of it (tools/server/server.cpp).
   */
  readonly slotContext: number | undefined
  readonly tensorParallel: number
  /** vLLM `--data-parallel-size`, SGLang `--dp-size`: one KV-event publisher per rank. */
  readonly dataParallel: number
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
  /** How long the graceful shutdown after the first SIGTERM/SIGINT takes (--sim-shutdown-delay, default 200ms). */
  readonly shutdownDelayMs: number
  readonly blockSize: number
  readonly kvBlocks: number
  readonly defaultMaxTokens: number
  readonly crashAfterRequests: number | undefined
  readonly crashAfterMs: number | undefined
  readonly stallAfterTokens: number | undefined
  readonly ignoreSigterm: boolean
  readonly forkGrandchild: boolean
  readonly errorRate: number
  readonly errorKind: ErrorKind
  readonly kvStopAfter: number | undefined
  readonly kvSkipSeq: number | undefined
  readonly hangHealth: boolean
  /** llama_cpp: answer /models and /v1/models 200 (`"meta": null`) while loading, as newer llama-server builds do. */
  readonly modelsWhileLoading: boolean
  readonly kvLegacyArrays: boolean
  /** vLLM before PR #29665: P sends no remote_request_id, D pulls under its own request id. */
  readonly nixlLegacy: boolean
  /** vLLM < 0.26 replay replies (3 frames, no topic). */
  readonly kvReplay3Frames: boolean
  readonly kvLeaseMs: number | undefined
  readonly bootstrapTimeoutMs: number | undefined
  /** Flags seen on the line that the simulator accepts but does not model. */
  readonly unmodelled: ReadonlyArray<string>
}

export class ArgsError extends Error {}

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

/** `0ms`, `50ms`, `2s`, `1.5s`, `1m`, `250` (ms). */
export const parseDuration = (text: string): number => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim())
  if (m === null) throw new ArgsError(`invalid duration: ${text}`)
  const n = Number(m[1])
  const unit = m[2] ?? "ms"
  return unit === "ms" ? n : unit === "s" ? n * 1000 : unit === "m" ? n * 60_000 : n * 3_600_000
}

const FLAVORS: ReadonlyArray<Flavor> = ["vllm", "sglang", "llama_cpp", "mlx"]
const ERROR_KINDS: ReadonlyArray<ErrorKind> = [
  "http400",
  "http404",
  "http429",
  "http500",
  "midstream",
  "sse_error_field",
  "reset"
]

/** Flags that take no value, per flavor family (anything else consumes the next word unless it is a flag). */
const BOOLEAN_FLAGS = new Set([
  "--sim-ignore-sigterm",
  "--sim-fork-grandchild",
  "--sim-hang-health",
  "--sim-models-while-loading",
  "--sim-kv-legacy-arrays",
  "--sim-nixl-legacy",
  "--sim-kv-replay-3-frames",
  "--enable-metrics",
  "--metrics",
  "--no-warmup",
  "--enforce-eager",
  "--trust-remote-code",
  "--enable-prefix-caching",
  "--no-enable-prefix-caching",
  "--disable-log-requests",
  "--enable-hierarchical-cache",
  "--skip-server-warmup",
  "--enable-lmcache",
  "--enable-force-include-usage",
  "--disable-hybrid-kv-cache-manager",
  "--enable-server-load-tracking",
  "--enable-metrics-for-all-schedulers",
  "--disaggregation-decode-enable-offload-kvcache",
  "--disaggregation-decode-enable-radix-cache",
  "--no-slots",
  "--slots",
  "-fa",
  "--flash-attn",
  "--cont-batching",
  "-cb",
  "--kv-unified",
  "-kvu",
  "--no-mmap",
  "--mlock",
  "--jinja",
  "--embedding",
  "--use-default-chat-template",
  "--pipeline",
  "--verbose",
  "-v"
])

const detectFlavor = (argv: ReadonlyArray<string>): { flavor: Flavor; rest: Array<string> } => {
  const rest = [...argv]
  const fi = rest.indexOf("--flavor")
  if (fi >= 0) {
    const f = rest[fi + 1] as Flavor
    if (!FLAVORS.includes(f)) throw new ArgsError(`unknown flavor: ${rest[fi + 1]}`)
    rest.splice(fi, 2)
    stripLauncher(rest)
    return { flavor: f, rest }
  }
  stripLauncher(rest)
  const first = rest[0]
  if (first === "serve") return { flavor: "vllm", rest }
  if (first === "-m" && rest[1]?.startsWith("sglang") === true) return { flavor: "sglang", rest }
  if (first === "-m" && rest[1]?.startsWith("mlx_lm") === true) return { flavor: "mlx", rest }
  if (rest.includes("--model-path") || rest.includes("--tp-size")) return { flavor: "sglang", rest }
  if (first === "-m" || first === "-hf" || first === "--hf-repo" || rest.includes("-np")) {
    return { flavor: "llama_cpp", rest }
  }
  if (first === "--model") return { flavor: "mlx", rest }
  return { flavor: "vllm", rest }
}

/** Drops launcher words an override may leave in front (`vllm`, `python -m sglang.launch_server`, ...). */
const stripLauncher = (rest: Array<string>): void => {
  for (;;) {
    const w = rest[0]
    if (w === "vllm" || w === "python" || w === "python3" || w === "llama-server" || w === "mlx_lm.server") {
      rest.shift()
    } else if (w === "-m" && (rest[1]?.startsWith("sglang.") === true || rest[1]?.startsWith("mlx_lm") === true)) {
      rest.splice(0, 2)
    } else if (w === "-m" && rest[1]?.startsWith("sglang") === true) {
      rest.splice(0, 2)
    } else return
  }
}

interface Parsed {
  readonly values: Map<string, string>
  readonly flags: Set<string>
  readonly positional: Array<string>
  readonly dotted: Map<string, Array<[string, string]>>
}

const tokenize = (rest: ReadonlyArray<string>): Parsed => {
  const values = new Map<string, string>()
  const flags = new Set<string>()
  const positional: Array<string> = []
  const dotted = new Map<string, Array<[string, string]>>()
  for (let i = 0; i < rest.length; i++) {
    const w = rest[i] ?? ""
    if (!w.startsWith("-") || /^-\d/.test(w)) {
      positional.push(w)
      continue
    }
    let name = w
    let value: string | undefined
    const eq = w.indexOf("=")
    if (eq > 0) {
      name = w.slice(0, eq)
      value = w.slice(eq + 1)
    }
    if (value === undefined && !BOOLEAN_FLAGS.has(name)) {
      const next = rest[i + 1]
      if (next !== undefined && (!next.startsWith("-") || /^-\d/.test(next))) {
        value = next
        i++
        // --served-model-name takes several names; keep the first.
        if (name === "--served-model-name") {
          while (rest[i + 1] !== undefined && !(rest[i + 1] ?? "").startsWith("-")) i++
        }
      }
    }
    const dot = name.indexOf(".")
    if (name.startsWith("--") && dot > 0) {
      const base = name.slice(0, dot)
      const list = dotted.get(base) ?? []
      list.push([name.slice(dot + 1), value ?? "true"])
      dotted.set(base, list)
      continue
    }
    if (value === undefined) flags.add(name)
    else values.set(name, value)
  }
  return { values, flags, positional, dotted }
}

const parseJsonFlag = (p: Parsed, name: string): Record<string, unknown> | undefined => {
  let obj: Record<string, unknown> | undefined
  const text = p.values.get(name)
  if (text !== undefined) {
    try {
      const v: unknown = JSON.parse(text)
      if (typeof v !== "object" || v === null || Array.isArray(v)) throw new ArgsError(`${name}: not a JSON object`)
      obj = v as Record<string, unknown>
    } catch (e) {
      throw new ArgsError(`${name}: ${e instanceof Error ? e.message : String(e)}`)
    }
  }
  for (const [key, raw] of p.dotted.get(name) ?? []) {
    obj ??= {}
    const append = key.endsWith("+")
    const parts = (append ? key.slice(0, -1) : key).split(".")
    let cur: Record<string, unknown> = obj
    for (const part of parts.slice(0, -1)) {
      const next = cur[part]
      if (typeof next !== "object" || next === null) cur[part] = {}
      cur = cur[part] as Record<string, unknown>
    }
    const leaf = parts[parts.length - 1] ?? ""
    const value = coerce(raw)
    if (append) {
      const arr = Array.isArray(cur[leaf]) ? (cur[leaf] as Array<unknown>) : []
      arr.push(value)
      cur[leaf] = arr
    } else cur[leaf] = value
  }
  return obj
}

const coerce = (raw: string): unknown => {
  if (raw === "true" || raw === "True") return true
  if (raw === "false" || raw === "False") return false
  if (/^-?\d+(\.\d+)?$/.test(raw)) return Number(raw)
  return raw
}

const num = (text: string | undefined, name: string): number | undefined => {
  if (text === undefined) return undefined
  const n = Number(text)
  if (!Number.isFinite(n)) throw new ArgsError(`${name}: not a number: ${text}`)
  return n
}

/** Flags each flavor understands; everything else on its line is unmodelled. */
const MODELLED: Record<Flavor, ReadonlyArray<string>> = {
  vllm: [
    "--host",
    "--port",
    "--model",
    "--tensor-parallel-size",
    "-tp",
    "--data-parallel-size",
    "-dp",
    "--served-model-name",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-transfer-config",
    "--kv-events-config",
    "--max-num-seqs",
    "--block-size"
  ],
  sglang: [
    "--host",
    "--port",
    "--model-path",
    "--model",
    "--tp-size",
    "--tensor-parallel-size",
    "--tp",
    "--dp-size",
    "--data-parallel-size",
    "--dp",
    "--served-model-name",
    "--context-length",
    "--mem-fraction-static",
    "--enable-metrics",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--kv-events-config",
    "--enable-hierarchical-cache",
    "--disaggregation-decode-enable-radix-cache",
    "--page-size",
    "--max-running-requests"
  ],
  llama_cpp: [
    "--host",
    "--port",
    "-m",
    "--model",
    "-hf",
    "--hf-repo",
    "-a",
    "--alias",
    "-c",
    "--ctx-size",
    "-np",
    "--parallel",
    "-ngl",
    "--n-gpu-layers",
    "--metrics"
  ],
  mlx: ["--host", "--port", "--model", "--max-tokens", "--decode-concurrency"]
}

const DEFAULT_PORT: Record<Flavor, number> = { vllm: 8000, sglang: 30000, llama_cpp: 8080, mlx: 8080 }

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
  let tensorParallel = 1
  let dataParallel = 1
  let enableMetrics = true
  let defaultMaxSeqs = 256
  let blockSize = 16
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
    if (maxModelLen !== undefined && maxModelLen > 0)
      slotContext = np === undefined ? maxModelLen : Math.floor(maxModelLen / np)
  } else {
    model = v("--model") ?? "mlx-community/model"
    servedName = model
    defaultMaxSeqs = num(v("--decode-concurrency"), "--decode-concurrency") ?? 32
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

  return {
    flavor,
    host: v("--host") ?? (flavor === "vllm" ? "0.0.0.0" : "127.0.0.1"),
    port: num(v("--port"), "--port") ?? DEFAULT_PORT[flavor],
    model,
    servedName,
    maxModelLen,
    slotContext,
    tensorParallel,
    dataParallel,
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
    shutdownDelayMs: dur("--sim-shutdown-delay") ?? 200,
    blockSize: num(v("--sim-block-size"), "--sim-block-size") ?? blockSize,
    kvBlocks: num(v("--sim-kv-blocks"), "--sim-kv-blocks") ?? 4096,
    defaultMaxTokens: num(v("--sim-default-max-tokens"), "--sim-default-max-tokens") ?? 16,
    crashAfterRequests: num(v("--sim-crash-after-requests"), "--sim-crash-after-requests"),
    crashAfterMs: dur("--sim-crash-after"),
    stallAfterTokens: num(v("--sim-stall-after-tokens"), "--sim-stall-after-tokens"),
    ignoreSigterm: p.flags.has("--sim-ignore-sigterm"),
    forkGrandchild: p.flags.has("--sim-fork-grandchild"),
    errorRate: num(v("--sim-error-rate"), "--sim-error-rate") ?? 0,
    errorKind: errorKind as ErrorKind,
    kvStopAfter: num(v("--sim-kv-stop-after"), "--sim-kv-stop-after"),
    kvSkipSeq: num(v("--sim-kv-skip-seq"), "--sim-kv-skip-seq"),
    hangHealth: p.flags.has("--sim-hang-health"),
    modelsWhileLoading: p.flags.has("--sim-models-while-loading"),
    kvLegacyArrays: p.flags.has("--sim-kv-legacy-arrays"),
    nixlLegacy: p.flags.has("--sim-nixl-legacy"),
    kvReplay3Frames: p.flags.has("--sim-kv-replay-3-frames"),
    kvLeaseMs: dur("--sim-kv-lease"),
    bootstrapTimeoutMs,
    unmodelled
  }
}
