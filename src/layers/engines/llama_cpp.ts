/**
 * llama.cpp: `llama-server -m FILE | -hf REPO -a SERVED --host --port [-c N] -ngl 999 --metrics`.
 * No tensor parallelism, GPU memory fraction, KV connector, events or disaggregation; all layers are
 * offloaded to the GPU and the Prometheus endpoint is switched on.
 */
import type { AgentConfig } from "../../services/Config.ts"
import type { Engine } from "../../services/Engine.ts"
import { assemble, httpProbe, listenOf, metricsAt, optionalFlag } from "./common.ts"

export const llamaCpp: Engine = {
  kind: "llama_cpp",
  capabilities: {
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: false,
    sources: ["hf_repo", "path"],
    modelSettings: ["max_model_len"]
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    return assemble(config, listen, {
      executable: ["llama-server"],
      args: [
        m.source.kind === "path" ? "-m" : "-hf",
        m.source.value,
        "-a",
        m.served_name,
        "--host",
        listen.host,
        "--port",
        String(listen.port),
        ...optionalFlag("-c", m.max_model_len),
        "-ngl",
        "999",
        "--metrics"
      ],
      probe: httpProbe(config, listen),
      metrics: metricsAt(listen, {
        running: ["llamacpp:requests_processing"],
        waiting: ["llamacpp:requests_deferred"],
        kvUsage: []
      })
    })
  }
}
