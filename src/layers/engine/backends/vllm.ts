/**
 * vLLM: `vllm serve MODEL --host --port --tensor-parallel-size --served-model-name ...`.
 * kv_offload picks the `--kv-transfer-config` connector; prefill/decode roles need NIXL, whose
 * side channel is set through VLLM_NIXL_SIDE_CHANNEL_HOST/PORT (vllm/envs.py). KV events go to
 * `--kv-events-config` (vllm/config/kv_events.py). Flags: vllm/engine/arg_utils.py.
 */

import type { AgentConfig, KvOffload } from "../../../services/config/Config.ts"
import { DEFAULT_KV_BLOCK_SIZE } from "../../../services/config/ConfigSchema.ts"
import { BREAKS, LISTEN_FLAGS } from "../../../services/engine/AgentFlags.ts"
import type { CpuCacheTier } from "../../../services/engine/CpuCache.ts"
import type { Engine, ExitHint, MetricNames, RenderHost } from "../../../services/engine/Engine.ts"
import { hostOfAddr, isLoopbackHost, isWildcardHost } from "../../../services/net/HostPort.ts"
import { assemble, httpProbe, kvEventsOf, listenOf, metricsAt, optionalFlag } from "./common.ts"
import { kvbmTier, kvbmTierNeed, lmcacheTier } from "./cpuCacheTiers.ts"
import { commandLineHint, HUB_REFUSALS, hubHint, modelKey, nowValue, TORCH_CUDA_OOM } from "./hints.ts"
import { VLLM_MARKS } from "./logMarks.ts"

/** The connector a `--kv-transfer-config` JSON names (vLLM's KVTransferConfig.kv_connector), or undefined. */
const kvConnectorOf = (json: string): string | undefined => {
  try {
    const v = JSON.parse(json) as { kv_connector?: unknown }
    return typeof v?.kv_connector === "string" ? v.kv_connector : undefined
  } catch {
    return undefined
  }
}

/**
 * The `--kv-transfer-config` body per kv_offload: NixlConnector and LMCacheConnectorV1 as in vLLM's
 * docs/features/disagg_prefill.md and examples/others/lmcache; KVBM's DynamoConnector as in ai-dynamo/dynamo
 * docs (kvbm.vllm_integration.connector).
 */
const connectors: Readonly<Record<KvOffload, Readonly<Record<string, string>> | undefined>> = {
  none: undefined,
  nixl: { kv_connector: "NixlConnector", kv_role: "kv_both", kv_load_failure_policy: "fail" },
  lmcache: { kv_connector: "LMCacheConnectorV1", kv_role: "kv_both" },
  kvbm: {
    kv_connector: "DynamoConnector",
    kv_role: "kv_both",
    kv_connector_module_path: "kvbm.vllm_integration.connector"
  },
  hicache: undefined
}

/** The CPU KV-cache tier each kv_offload puts in host RAM (cpuCacheTiers.ts); NIXL only transfers. */
const cpuCaches: Readonly<Record<KvOffload, ((config: AgentConfig) => CpuCacheTier) | undefined>> = {
  none: undefined,
  nixl: undefined,
  lmcache: lmcacheTier,
  kvbm: () => kvbmTier,
  hicache: undefined
}

const handOff = {
  kvOffloads: ["nixl"],
  why: "the NIXL connector hands the prefilled KV cache to the decode instance"
} as const

/**
 * vLLM picks its block size per platform and model (vllm/config/cache.py, `block_size` None until the
 * platform's check_and_update_config) unless `--block-size` is given, while the KV bridge announces
 * `[kv].block_size` to cgn-kvcached: with KV events on they must agree, so the value is rendered; it is
 * rendered too when the file sets a size other than the default, as the operator asked for one.
 */
const blockSizeArgs = (config: AgentConfig, kvEvents: boolean): ReadonlyArray<string> =>
  kvEvents || config.kv.block_size !== DEFAULT_KV_BLOCK_SIZE ? ["--block-size", String(config.kv.block_size)] : []

/**
 * KVBM's cache tiers are sized by env only (ai-dynamo/dynamo KVBM docs: DYN_KVBM_CPU_CACHE_GB,
 * DYN_KVBM_DISK_CACHE_GB), and its leader refuses to start with neither ("At least one cache tier must be
 * configured"). `[engine].env` can still set them, or the block-count overrides, and wins over these.
 */
const kvbmTiers = (config: AgentConfig): Record<string, string> => {
  const e = config.engine
  if (e.kv_offload !== "kvbm") return {}
  return {
    ...(e.kvbm_cpu_cache_gb !== undefined ? { DYN_KVBM_CPU_CACHE_GB: String(e.kvbm_cpu_cache_gb) } : {}),
    ...(e.kvbm_disk_cache_gb !== undefined ? { DYN_KVBM_DISK_CACHE_GB: String(e.kvbm_disk_cache_gb) } : {})
  }
}

/**
 * How vLLM dies at start of a cause the config fixes, newest line first (services/engine/ExitHints.ts). The root
 * cause is the EngineCore's exception; the API server's last line only says "Engine core initialization failed.
 * See root cause above." (vllm/v1/engine/utils.py, wait_for_engine_startup), which matches nothing here.
 */
const exitHints = (config: AgentConfig): ReadonlyArray<ExitHint> => {
  const m = config.model
  const gmu = modelKey(config, "gpu_memory_utilization")
  const len = modelKey(config, "max_model_len")
  const tp = modelKey(config, "tp")
  return [
    {
      // vllm/v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory (before V1: vllm/worker/worker.py,
      // raise_if_cache_size_invalid): "No available memory for the cache blocks. Try increasing
      // `gpu_memory_utilization` when initializing the engine."
      patterns: ["No available memory for the cache blocks"],
      hint:
        `vLLM has no GPU memory left for its KV cache once the weights are loaded: raise ${gmu}${nowValue(m.gpu_memory_utilization)}` +
        ` (vLLM's default is 0.9) or spread the model over more GPUs (${tp})`
    },
    {
      // The same function: "To serve at least one request with the models's max seq len (N), (X GiB KV cache is
      // needed, which is larger than the available KV cache memory (Y GiB). ... Try increasing
      // `gpu_memory_utilization` or decreasing `max_model_len`"; before V1 (vllm/worker/worker.py,
      // raise_if_cache_size_invalid): "The model's max seq len (N) is larger than the maximum number of tokens that
      // can be stored in KV cache (M)."
      patterns: [
        "KV cache is needed, which is larger than the available KV cache memory",
        "is larger than the maximum number of tokens that can be stored in KV cache"
      ],
      hint:
        `vLLM's KV cache cannot hold one sequence of the model's max length: lower ${len}${nowValue(m.max_model_len)}` +
        ` (vLLM's line names the largest that fits) or raise ${gmu}`
    },
    {
      // vllm/v1/worker/utils.py, request_memory: "Free memory on device ... on startup is less than desired GPU
      // memory utilization (U, X GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
      patterns: ["on startup is less than desired GPU memory utilization"],
      hint:
        `the GPUs have less free memory than ${gmu} asks vLLM to take: another process holds GPU memory ` +
        `(engine.gpu_free_below_mib is what the agent waits for), or lower ${gmu}${nowValue(m.gpu_memory_utilization)}`
    },
    {
      patterns: [TORCH_CUDA_OOM],
      hint:
        `the engine ran out of GPU memory while loading: spread the weights over more GPUs (${tp}), lower ${len}, ` +
        "or free the GPUs of other processes"
    },
    // vllm/transformers_utils/config.py, get_config: "Invalid repository ID or local directory specified: 'M'." is
    // raised from the Hub's refusal (a gated repo) or for a repo or directory without a config.
    hubHint(config, ["Invalid repository ID or local directory specified", ...HUB_REFUSALS]),
    commandLineHint(config, vllm.capabilities.displayName)
  ]
}

/** vLLM's series that carry the load signals and progress (capabilities.metricNames). */
const METRICS: MetricNames = {
  running: ["vllm:num_requests_running"],
  waiting: ["vllm:num_requests_waiting"],
  kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
  // The token counters move at each engine step that outputs something (vllm/v1/metrics/stats.py
  // IterationStats.update_from_output: a request's prompt once its whole prefill is done, each generated
  // token; recorded per output batch by vllm/v1/metrics/loggers.py PrometheusStatLogger.record, one child per
  // engine core): a prefill leg (max_tokens 1) moves both as its prefill ends. The prefix-cache queries move
  // as the scheduler takes up a waiting request (vllm/v1/core/kv_cache_manager.py get_computed_blocks, in
  // every step's SchedulerStats; the old name before 0.9): under FIFO overload legs can be aborted mid-prefill
  // one after another, so that no prompt completes for a while on a busy engine, but each one the scheduler
  // starts in a freed slot counts there. A hung step (a collective, a stuck scheduler) moves none of them.
  progress: [
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total"
  ],
  // every vLLM family has a child per engine core, labelled with its index (PrometheusStatLogger, labelnames
  // ["model_name", "engine"])
  rankLabel: "engine"
}

export const vllm: Engine = {
  kind: "vllm",
  capabilities: {
    metricNames: METRICS,
    displayName: "vLLM",
    // vllm/entrypoints/openai/cli_args.py (--host, --port, --served-model-name), vllm/engine/arg_utils.py (-tp, -dp)
    agentFlags: [
      LISTEN_FLAGS,
      { flags: ["--served-model-name"], key: "models.<name>.served_name", breaks: BREAKS.servedName },
      { flags: ["--tensor-parallel-size", "-tp"], key: "models.<name>.tp", breaks: BREAKS.tp },
      { flags: ["--data-parallel-size", "-dp"], key: "models.<name>.dp", breaks: BREAKS.dp }
    ],
    modelPath: "directory-or-gguf",
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none", "nixl", "lmcache", "kvbm"],
    roles: ["prefill", "decode", "both"],
    handoff: "kv_transfer_params",
    roleKvOffloads: { prefill: handOff, decode: handOff },
    kvEvents: true,
    tensorParallel: true,
    dataParallel: true,
    sources: ["hf_repo", "path"],
    // A finished choice's stop_reason: the stop string, a stop token id, or null (vllm/entrypoints/openai
    // protocol.py, CompletionResponseStreamChoice and ChatCompletionResponseStreamChoice).
    stopSequenceField: "stop_reason",
    // SamplingParams.ignore_eos, taken by the OpenAI completions endpoint (vllm/entrypoints/openai/protocol.py)
    ignoreEos: true,
    // VLLM_NIXL_SIDE_CHANNEL_PORT, rendered for NIXL only; each DP rank listens on it + its rank
    // (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py)
    sideChannelOffloads: ["nixl"],
    // The API server routes a request to the rank this header names (vllm/entrypoints/openai/serving_engine.py
    // _get_data_parallel_rank; out of range: a 400 from the input processor, vllm/v1/engine/processor.py). A dense
    // model's DP ranks are independent engine cores (vllm/v1/engine/core.py run_engine_core), so one can hang alone.
    rankHeader: "X-data-parallel-rank",
    // The base model's card carries the model's max_model_len, a LoRA's none (show_available_models,
    // vllm/entrypoints/openai/serving_models.py; ModelCard in protocol.py).
    servedContext: { path: "/v1/models", fields: [["max_model_len"]] },
    // `--api-key`, else VLLM_API_KEY (vllm/entrypoints/openai/api_server.py); every route but /health, /ping, /load,
    // /version and /metrics then answers 401 without `Authorization: Bearer <key>` (AuthenticationMiddleware,
    // vllm/entrypoints/openai/server_utils.py; older versions guarded /v1 alone).
    apiKey: { via: { env: "VLLM_API_KEY" }, flags: ["--api-key"], env: ["VLLM_API_KEY"] }
    // No peerlessFields: the NixlConnector serves a request without kv_transfer_params as a local one on either
    // role (get_num_new_matched_tokens, update_state_after_alloc and request_finished return early,
    // vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
  },
  render: (config: AgentConfig, host?: RenderHost) => {
    const listen = listenOf(config)
    const m = config.model
    const connector = connectors[config.engine.kv_offload]
    const events = kvEventsOf(config, "vllm")
    // NIXL's handshake listener advertises this host to the peer, so it must be routable from it: the host
    // the node advertises (advertise_addr, else NODE_IP as in a DaemonSet on the host network), else the
    // engine's own listen host where a peer can reach it, else the host the node advertises by default (a loopback
    // engine's host is no address for a peer on another host).
    const engineHost =
      (isLoopbackHost(listen.host) || isWildcardHost(listen.host)) && host?.advertiseHost !== undefined
        ? host.advertiseHost
        : listen.host
    const nixlEnv: Record<string, string> =
      config.engine.kv_offload === "nixl"
        ? {
            VLLM_NIXL_SIDE_CHANNEL_HOST:
              config.engine.side_channel_host ??
              (config.agent.advertise_addr !== undefined
                ? hostOfAddr(config.agent.advertise_addr)
                : (config.agent.node_ip ?? engineHost)),
            VLLM_NIXL_SIDE_CHANNEL_PORT: String(config.engine.side_channel_port)
          }
        : {}
    const kvbmEnv = kvbmTiers(config)
    return assemble(config, listen, {
      executable: ["vllm"],
      // a P/D pair's connector (config checks require NIXL for the roles): both halves must use the same
      kvTransfer:
        config.agent.role === "both" || connector?.kv_connector === undefined
          ? undefined
          : { value: connector.kv_connector, flag: "--kv-transfer-config", of: kvConnectorOf },
      args: [
        "serve",
        m.source.value,
        "--host",
        listen.host,
        "--port",
        String(listen.port),
        "--tensor-parallel-size",
        String(m.tp),
        "--served-model-name",
        m.served_name,
        ...optionalFlag("--data-parallel-size", m.dp > 1 ? m.dp : undefined),
        ...optionalFlag("--max-model-len", m.max_model_len),
        ...optionalFlag("--gpu-memory-utilization", m.gpu_memory_utilization),
        ...(connector !== undefined ? ["--kv-transfer-config", JSON.stringify(connector)] : []),
        ...(events !== undefined ? ["--kv-events-config", events.json] : []),
        ...blockSizeArgs(config, events !== undefined)
      ],
      env: { ...nixlEnv, ...kvbmEnv },
      cpuCache: cpuCaches[config.engine.kv_offload]?.(config),
      environmentNeed: config.engine.kv_offload === "kvbm" ? kvbmTierNeed : undefined,
      probe: httpProbe(config, listen),
      // Liveness on /health: 503 once the engine core is dead (EngineDeadError;
      // vllm/entrypoints/serve/instrumentator/health.py), while /v1/models answers from the API server alone and
      // stays 200 under an API server kept up without its engine (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH).
      liveness: { kind: "http", url: `${listen.baseUrl}/health` },
      metrics: metricsAt(listen, METRICS),
      kvEvents: events?.endpoint,
      exitHints: exitHints(config),
      logLevels: VLLM_MARKS
    })
  }
}
