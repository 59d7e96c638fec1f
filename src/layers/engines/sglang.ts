/**
 * SGLang: `python -m sglang.launch_server --model-path M --host --port --tp-size ... --enable-metrics`.
 * kv_offload hicache/lmcache add cache flags; nixl is only the prefill/decode transfer backend, so it
 * needs a prefill or decode role. KV events need `"publisher":"zmq"` and a page size to hash blocks by.
 */
import type { AgentConfig } from "../../services/Config.ts"
import type { Engine } from "../../services/Engine.ts"
import { assemble, httpProbe, kvEventsOf, listenOf, metricsAt, optionalFlag } from "./common.ts"

export const sglang: Engine = {
  kind: "sglang",
  capabilities: {
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none", "hicache", "lmcache", "nixl"],
    roles: ["prefill", "decode", "both"],
    roleKvOffloads: {
      both: {
        kvOffloads: ["none", "hicache", "lmcache"],
        why: 'SGLang uses "nixl" only as the prefill/decode transfer backend; set agent.role to "prefill" or "decode"'
      }
    },
    kvEvents: true,
    tensorParallel: true,
    sources: ["hf_repo", "path"]
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    const offload = config.engine.kv_offload
    const role = config.agent.role
    const events = kvEventsOf(config, "sglang")
    const cache =
      offload === "hicache"
        ? ["--enable-hierarchical-cache", "--hicache-ratio", "2"]
        : offload === "lmcache"
          ? ["--enable-lmcache"]
          : []
    const disaggregation =
      role === "both"
        ? []
        : [
            "--disaggregation-mode",
            role,
            "--disaggregation-transfer-backend",
            offload === "nixl" ? "nixl" : "mooncake",
            ...(role === "prefill" ? ["--disaggregation-bootstrap-port", String(config.engine.bootstrap_port)] : [])
          ]
    return assemble(config, listen, {
      executable: ["python", "-m", "sglang.launch_server"],
      args: [
        "--model-path",
        m.source.value,
        "--host",
        listen.host,
        "--port",
        String(listen.port),
        "--tp-size",
        String(m.tp),
        "--served-model-name",
        m.served_name,
        ...optionalFlag("--context-length", m.max_model_len),
        ...optionalFlag("--mem-fraction-static", m.gpu_memory_utilization),
        "--enable-metrics",
        ...cache,
        ...disaggregation,
        // The default page size of 1 would make every token its own event block.
        ...(events !== undefined
          ? ["--page-size", String(config.kv.block_size), "--kv-events-config", events.json]
          : [])
      ],
      probe: httpProbe(config, listen),
      metrics: metricsAt(listen, {
        running: ["sglang:num_running_reqs"],
        waiting: ["sglang:num_queue_reqs"],
        kvUsage: ["sglang:token_usage"]
      }),
      kvEvents: events?.endpoint
    })
  }
}
