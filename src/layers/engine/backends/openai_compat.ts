/**
 * openai_compat: an OpenAI-compatible server the agent does not start (a remote vLLM, a gateway).
 * The plan has no argv; the agent only proxies `[engine].url` and probes its `/v1/models`.
 * No Prometheus names are assumed, since the server's kind is unknown.
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import type { Engine, EngineCapabilities } from "../../../services/engine/Engine.ts"
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
      ...(config.engine.proxied_kind === undefined ? {} : { proxiedKind: config.engine.proxied_kind }),
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

/**
 * How a server speaks, which a proxied one of a known kind (`engine.proxied_kind`) does as that engine: its request
 * dialect (llama-server reads `repeat_penalty`, and ignores `repetition_penalty` silently), the field naming the stop
 * string, ignore_eos, its output faults, whether it closes a streamed answer's connection (llama-server does: a call
 * sent on it failed "other side closed"), where it says its context. The rest stays openai_compat's: nothing spawned,
 * no GPUs, no P/D.
 */
export const PROXIED_WIRE = [
  "requestDialect",
  "stopSequenceField",
  "ignoreEos",
  "outputFaults",
  "closesStreamedConnections",
  "servedContext"
] as const satisfies ReadonlyArray<keyof EngineCapabilities>

/** openai_compat in front of `proxied`'s kind of server: its wire capabilities, the rest openai_compat's. */
export const proxying = (proxied: Engine): Engine => {
  const wire: Partial<EngineCapabilities> = {}
  for (const k of PROXIED_WIRE)
    if (proxied.capabilities[k] !== undefined) Object.assign(wire, { [k]: proxied.capabilities[k] })
  return {
    ...openaiCompat,
    capabilities: {
      ...openaiCompat.capabilities,
      ...wire,
      displayName: `the proxied ${proxied.capabilities.displayName}`
    }
  }
}
