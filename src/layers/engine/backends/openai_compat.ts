/**
 * openai_compat: an OpenAI-compatible server the agent does not start (a remote vLLM, a gateway).
 * The plan has no argv; the agent only proxies `[engine].url` and probes its `/v1/models`.
 * No Prometheus names are assumed, since the server's kind is unknown.
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import type { Engine } from "../../../services/engine/Engine.ts"
import { httpProbe, listenOf, livenessOf } from "./common.ts"

export const openaiCompat: Engine = {
  kind: "openai_compat",
  capabilities: {
    displayName: "the proxied server",
    spawns: false,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: true,
    sources: ["hf_repo", "path"],
    modelSettings: [],
    // The proxied server's kind is unknown: vLLM's and SGLang's card field, else llama-server's per-slot one.
    servedContext: { path: "/v1/models", fields: [["max_model_len"], ["meta", "n_ctx"]] }
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const probe = httpProbe(config, listen)
    return {
      kind: "openai_compat",
      spawns: false,
      argv: [],
      env: {},
      baseUrl: listen.baseUrl,
      host: listen.host,
      port: listen.port,
      probe,
      liveness: livenessOf(config, listen, undefined, probe),
      metrics: undefined,
      kvEvents: undefined,
      servedModel: config.model.served_name,
      requestModel: config.model.served_name
    }
  }
}
