// The simulator's per-engine flag tables: which flavors and error kinds exist, which flags take no value,
// which flags each engine's line models (everything else is logged as unmodelled) and each engine's port.
import type { ErrorKind, Flavor } from "./simConfig.ts"

export const FLAVORS: ReadonlyArray<Flavor> = ["vllm", "sglang", "llama_cpp", "mlx"]
export const ERROR_KINDS: ReadonlyArray<ErrorKind> = [
  "http400",
  "http404",
  "http429",
  "http500",
  "midstream",
  "sse_error_field",
  "reset"
]

/** Flags that take no value, per flavor family (anything else consumes the next word unless it is a flag). */
export const BOOLEAN_FLAGS = new Set([
  "--sim-ignore-sigterm",
  "--sim-strict-args",
  "--sim-sigterm-waits-streams",
  "--sim-fork-grandchild",
  "--sim-hang-health",
  "--sim-models-while-loading",
  "--sim-kv-legacy-arrays",
  "--sim-legacy-errors",
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

/** Flags each flavor understands; everything else on its line is unmodelled. */
export const MODELLED: Record<Flavor, ReadonlyArray<string>> = {
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
    "--block-size",
    "--api-key"
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
    "--load-balance-method",
    "--served-model-name",
    "--context-length",
    "--mem-fraction-static",
    "--enable-metrics",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--kv-events-config",
    "--enable-hierarchical-cache",
    // Rendered by the agent for kv_offload = "hicache" / "lmcache"; nothing to simulate (the host-memory KV tier),
    // listed so the renderers' flags are all checked against this table (sgl-project/sglang
    // docs/advanced_features/server_arguments.md).
    "--hicache-ratio",
    "--enable-lmcache",
    "--disaggregation-decode-enable-radix-cache",
    "--page-size",
    "--max-running-requests",
    "--api-key",
    "--admin-api-key"
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
    "--metrics",
    "--sse-ping-interval",
    "-sps",
    "--slot-prompt-similarity",
    "--api-key",
    "--api-key-file"
  ],
  mlx: ["--host", "--port", "--model", "--max-tokens", "--decode-concurrency"]
}

export const DEFAULT_PORT: Record<Flavor, number> = { vllm: 8000, sglang: 30000, llama_cpp: 8080, mlx: 8080 }
