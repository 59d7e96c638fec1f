/**
 * vLLM: `vllm serve MODEL --host --port --tensor-parallel-size --served-model-name ...`.
 * kv_offload picks the `--kv-transfer-config` connector; prefill/decode roles need NIXL, whose
 * side channel is set through VLLM_NIXL_SIDE_CHANNEL_HOST/PORT. KV events go to `--kv-events-config`.
 */
import type { AgentConfig, KvOffload } from "../../services/Config.ts"
import type { Engine } from "../../services/Engine.ts"
import { assemble, hostOfAddr, httpProbe, kvEventsOf, listenOf, metricsAt, optionalFlag } from "./common.ts"

/** The `--kv-transfer-config` body per kv_offload (engines.md §2). */
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

export const vllm: Engine = {
  kind: "vllm",
  capabilities: {
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none", "nixl", "lmcache", "kvbm"],
    roles: ["prefill", "decode", "both"],
    roleKvOffloads: { prefill: handOff, decode: handOff },
    kvEvents: true,
    tensorParallel: true,
    sources: ["hf_repo", "path"]
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    const connector = connectors[config.engine.kv_offload]
    const events = kvEventsOf(config, "vllm")
    // NIXL's handshake listener advertises this host to the peer, so it must be routable from it.
    const nixlEnv: Record<string, string> =
      config.engine.kv_offload === "nixl"
        ? {
            VLLM_NIXL_SIDE_CHANNEL_HOST:
              config.engine.side_channel_host ??
              (config.agent.advertise_addr !== undefined ? hostOfAddr(config.agent.advertise_addr) : listen.host),
            VLLM_NIXL_SIDE_CHANNEL_PORT: String(config.engine.side_channel_port)
          }
        : {}
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
        ...optionalFlag("--max-model-len", m.max_model_len),
        ...optionalFlag("--gpu-memory-utilization", m.gpu_memory_utilization),
        ...(connector !== undefined ? ["--kv-transfer-config", JSON.stringify(connector)] : []),
        ...(events !== undefined ? ["--kv-events-config", events.json] : [])
      ],
      env: nixlEnv,
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
