/**
 * openai_compat: an OpenAI-compatible server the agent does not start (a remote vLLM, a gateway).
 * The plan has no argv; the agent only proxies `[engine].url` and probes its `/v1/models`.
 * No Prometheus names are assumed unless `engine.proxied_kind` says what the server is (then its `/metrics` is read by
 * that engine's names: `proxying`).
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import type { Engine, EngineCapabilities } from "../../../services/engine/Engine.ts"
import { httpProbe, listenOf, livenessOf, metricsAt } from "./common.ts"

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
 * sent on it failed "other side closed"), where it says its context, the Prometheus series it exports (its load
 * signals and progress counters, read from `/metrics` on `engine.url`'s origin, as for the engine the agent spawns).
 * The rest stays openai_compat's: nothing spawned, no GPUs, no P/D.
 */
export const PROXIED_WIRE = [
  "requestDialect",
  "stopSequenceField",
  "ignoreEos",
  "outputFaults",
  "closesStreamedConnections",
  "servedContext",
  "metricNames"
] as const satisfies ReadonlyArray<keyof EngineCapabilities>

/** openai_compat in front of `proxied`'s kind of server: its wire capabilities, the rest openai_compat's. */
export const proxying = (proxied: Engine): Engine => {
  const wire: Partial<EngineCapabilities> = {}
  for (const k of PROXIED_WIRE)
    if (proxied.capabilities[k] !== undefined) Object.assign(wire, { [k]: proxied.capabilities[k] })
  const names = proxied.capabilities.metricNames
  return {
    ...openaiCompat,
    capabilities: {
      ...openaiCompat.capabilities,
      ...wire,
      displayName: `the proxied ${proxied.capabilities.displayName}`
    },
    // A server that does not export them (llama-server without `--metrics`: 501; SGLang without `--enable-metrics`:
    // 404) fails each scrape: logged once (layers/node/engineLoad.ts), and its load is the agent's own count again.
    render:
      names === undefined
        ? openaiCompat.render
        : (config, host) => ({ ...openaiCompat.render(config, host), metrics: metricsAt(listenOf(config), names) })
  }
}
