/**
 * llama.cpp: `llama-server -m FILE | -hf REPO -a SERVED --host --port [-c N] -ngl 999 --metrics`.
 * No tensor parallelism, GPU memory fraction, KV connector, events or disaggregation; all layers are
 * offloaded to the GPU and the Prometheus endpoint is switched on.
 *
 * Readiness is GET `/health`: it answers 503 "Loading model" until the model is loaded in every version,
 * while newer builds answer `/models` and `/v1/models` 200 during loading (llama.cpp
 * `tools/server/server-http.cpp`, `middleware_server_state`).
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import type { Engine } from "../../../services/engine/Engine.ts"
import { assemble, listenOf, metricsAt, optionalFlag } from "./common.ts"

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
    modelSettings: ["max_model_len"],
    // `-a` is a comma-separated list of aliases (llama.cpp `common/arg.cpp`, `--alias`).
    servedNameForbids: { chars: ",", why: "llama-server splits -a on commas into several aliases" },
    // llama-server's request schema (tools/server/server-schema.cpp): the repetition penalty is `repeat_penalty`
    // (a `repetition_penalty` field is ignored, silently), and `seed` is a uint32_t whose 0xFFFFFFFF is
    // LLAMA_DEFAULT_SEED, "use a random seed" (include/llama.h); larger values keep only their low 32 bits.
    requestDialect: {
      fieldNames: { repetition_penalty: "repeat_penalty" },
      maxSeed: {
        value: 4_294_967_294n,
        why: "llama-server keeps a 32-bit seed, and 4294967295 means a random one"
      }
    }
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
      probe: { kind: "http", url: config.agent.ready_probe_url ?? `${listen.baseUrl}/health` },
      metrics: metricsAt(listen, {
        running: ["llamacpp:requests_processing"],
        waiting: ["llamacpp:requests_deferred"],
        kvUsage: []
      })
    })
  }
}
