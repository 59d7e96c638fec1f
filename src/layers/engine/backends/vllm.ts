/**
 * vLLM: `vllm serve MODEL --host --port --tensor-parallel-size --served-model-name ...`.
 * kv_offload picks the `--kv-transfer-config` connector; prefill/decode roles need NIXL, whose
 * side channel is set through VLLM_NIXL_SIDE_CHANNEL_HOST/PORT (vllm/envs.py). KV events go to
 * `--kv-events-config` (vllm/config/kv_events.py). Flags: vllm/engine/arg_utils.py.
 */
import type { AgentConfig, KvOffload } from "../../../services/config/Config.ts"
import { DEFAULT_KV_BLOCK_SIZE } from "../../../services/config/ConfigSchema.ts"
import type { Engine } from "../../../services/engine/Engine.ts"
import { hostOfAddr } from "../../../services/net/HostPort.ts"
import { assemble, httpProbe, kvEventsOf, listenOf, metricsAt, optionalFlag } from "./common.ts"

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

export const vllm: Engine = {
  kind: "vllm",
  capabilities: {
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
    stopSequenceField: "stop_reason"
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    const connector = connectors[config.engine.kv_offload]
    const events = kvEventsOf(config, "vllm")
    // NIXL's handshake listener advertises this host to the peer, so it must be routable from it: the host
    // the node advertises (advertise_addr, else NODE_IP as in a DaemonSet on the host network), else the
    // engine's own listen host.
    const nixlEnv: Record<string, string> =
      config.engine.kv_offload === "nixl"
        ? {
            VLLM_NIXL_SIDE_CHANNEL_HOST:
              config.engine.side_channel_host ??
              (config.agent.advertise_addr !== undefined
                ? hostOfAddr(config.agent.advertise_addr)
                : (config.agent.node_ip ?? listen.host)),
            VLLM_NIXL_SIDE_CHANNEL_PORT: String(config.engine.side_channel_port)
          }
        : {}
    const kvbmEnv = kvbmTiers(config)
    return assemble(config, listen, {
      executable: ["vllm"],
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
      // KVBM's GB is 10^9 bytes, and a block count set instead wins (ai-dynamo/dynamo
      // lib/llm/src/block_manager/distributed/leader.rs compute_num_blocks: cache_size_in_gb * 1_000_000_000.0)
      cpuCacheVariable:
        config.engine.kv_offload === "kvbm"
          ? { name: "DYN_KVBM_CPU_CACHE_GB", bytesPerUnit: 1e9, unlessSet: "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS" }
          : undefined,
      probe: httpProbe(config, listen),
      metrics: metricsAt(listen, {
        running: ["vllm:num_requests_running"],
        waiting: ["vllm:num_requests_waiting"],
        kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
      }),
      kvEvents: events?.endpoint
    })
  }
}
