/**
 * The pieces every engine renderer shares: where the engine listens (from `[engine].url`), how argv is
 * assembled (`[engine].command` replaces the executable, then rendered args, model args, engine args),
 * the readiness probe, the metrics endpoint and the ZMQ KV-events settings.
 * Pure: no I/O, no `node:*` imports. Engine-specific flags stay in the engine's own module.
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import { lastFlagValue } from "../../../services/engine/ArgvFlags.ts"
import type { CpuCacheTier } from "../../../services/engine/CpuCache.ts"
import type {
  ExitHint,
  KvEventsEndpoint,
  LaunchPlan,
  MetricNames,
  ReadinessProbe
} from "../../../services/engine/Engine.ts"
import type { EnvironmentNeed } from "../../../services/engine/EngineEnvironment.ts"
import type { LogLevelMarks } from "../../../services/engine/LineLevels.ts"
import { unbracket } from "../../../services/net/HostPort.ts"

/** Where the engine's HTTP server is, taken from `[engine].url`. */
export interface Listen {
  /** Origin plus path, without a trailing slash, e.g. `http://127.0.0.1:8000`. */
  readonly baseUrl: string
  /** The host as an engine's `--host` wants it (IPv6 without brackets). */
  readonly host: string
  readonly port: number
}

/**
 * Host and port of `[engine].url`; a URL without a port uses the scheme's (80/443). The URL is a server root: a
 * path or query is refused by the config's cross-checks.
 */
export const listenOf = (config: AgentConfig): Listen => {
  const u = new URL(config.engine.url)
  return { baseUrl: `${u.protocol}//${u.host}`, host: unbracket(u.hostname), port: portOf(u) }
}

/** The port of an engine URL: the one written, else the scheme's. */
export const portOf = (u: URL): number => (u.port !== "" ? Number(u.port) : u.protocol === "https:" ? 443 : 80)

/**
 * `[agent].ready_probe_url` when set, else GET `/v1/models`, which answers only once the model is loaded or lists it
 * as still loading (a newer llama-server behind openai_compat: services/engine/ModelList.ts).
 */
export const httpProbe = (config: AgentConfig, listen: Listen): ReadinessProbe =>
  config.agent.ready_probe_url !== undefined
    ? { kind: "http", url: config.agent.ready_probe_url }
    : { kind: "http", url: `${listen.baseUrl}/v1/models`, modelList: config.model.served_name }

/** `[agent].ready_probe_url` when set, else GET `path` on the engine (an engine whose readiness is not `/v1/models`). */
export const httpProbeAt = (config: AgentConfig, listen: Listen, path: string): ReadinessProbe => ({
  kind: "http",
  url: config.agent.ready_probe_url ?? `${listen.baseUrl}${path}`
})

/** Liveness: GET `[engine].liveness_path` when set, else the engine's own choice, else the readiness probe. */
export const livenessOf = (
  config: AgentConfig,
  listen: Listen,
  engineDefault: ReadinessProbe | undefined,
  probe: ReadinessProbe
): ReadinessProbe => {
  const path = config.engine.liveness_path
  return path !== undefined ? { kind: "http", url: `${listen.baseUrl}${path}` } : (engineDefault ?? probe)
}

/** The Prometheus endpoint on the engine's API port. */
export const metricsAt = (listen: Listen, names: MetricNames): LaunchPlan["metrics"] => ({
  url: `${listen.baseUrl}/metrics`,
  names
})

/**
 * The `--kv-events-config` JSON and the endpoint record, or undefined when `[kv].events` is off.
 * vLLM wants `enable_kv_cache_events`; SGLang has no such field (its KVEventsConfig, a pydantic model that ignores
 * unknown keys: python/sglang/srt/disaggregation/kv_events.py) and defaults `publisher` to "null", so both name the
 * ZMQ publisher explicitly.
 */
export const kvEventsOf = (
  config: AgentConfig,
  flavor: "vllm" | "sglang"
): { readonly json: string; readonly endpoint: KvEventsEndpoint } | undefined => {
  const kv = config.kv
  if (!kv.events) return undefined
  const body: Record<string, unknown> = {
    ...(flavor === "vllm" ? { enable_kv_cache_events: true } : {}),
    publisher: "zmq",
    endpoint: kv.events_endpoint,
    topic: kv.topic,
    ...(kv.replay_endpoint !== undefined ? { replay_endpoint: kv.replay_endpoint } : {})
  }
  return {
    json: JSON.stringify(body),
    endpoint: {
      endpoint: kv.events_endpoint,
      engineBinds: engineBinds(kv.events_endpoint, flavor),
      replayEndpoint: kv.replay_endpoint,
      topic: kv.topic,
      ...(config.model.dp > 1 ? { dpSize: config.model.dp } : {})
    }
  }
}

/**
 * What in an endpoint makes the engine's PUB socket bind it rather than connect: vLLM binds `*`, `::`
 * (vllm-project/vllm vllm/distributed/kv_events.py); newest SGLang also binds `0.0.0.0`
 * (sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py `_socket_setup`). Both bind ipc/inproc.
 */
const BIND_MARKERS: Readonly<Record<"vllm" | "sglang", ReadonlyArray<string>>> = {
  vllm: ["*", "::"],
  sglang: ["*", "::", "0.0.0.0"]
}

/** Whether the engine binds the endpoint (then the agent connects) or connects to it (then the agent binds). */
export const engineBinds = (endpoint: string, flavor: "vllm" | "sglang" = "vllm"): boolean =>
  BIND_MARKERS[flavor].some((m) => endpoint.includes(m)) ||
  endpoint.startsWith("ipc://") ||
  endpoint.startsWith("inproc://")

/** What a renderer decides; `assemble` adds what is the same for every engine. */
export interface PlanParts {
  /** The engine's own executable words, replaced by `[engine].command` when set. */
  readonly executable: ReadonlyArray<string>
  readonly args: ReadonlyArray<string>
  /** Engine-specific variables; `[engine].env` is applied over them, so an operator can override any. */
  readonly env?: Readonly<Record<string, string>>
  readonly probe: ReadinessProbe
  /** The engine's liveness probe when it is not `probe`. */
  readonly liveness?: ReadinessProbe
  /** LaunchPlan.livenessTimeoutFloorMs. */
  readonly livenessTimeoutFloorMs?: number
  readonly metrics: LaunchPlan["metrics"]
  readonly kvEvents?: KvEventsEndpoint | undefined
  /** Defaults to the served name. */
  readonly requestModel?: string
  readonly warnings?: ReadonlyArray<string>
  /** Where the engine's CPU KV-cache tier takes its size from (LaunchPlan.cpuCache). */
  readonly cpuCache?: CpuCacheTier | undefined
  /** What the engine's environment must give it (LaunchPlan.environmentNeed). */
  readonly environmentNeed?: EnvironmentNeed | undefined
  /** The engine's well-known start failures and the config keys that fix them (LaunchPlan.exitHints). */
  readonly exitHints?: ReadonlyArray<ExitHint>
  /** How the engine marks its log lines' levels (LaunchPlan.logLevels; logMarks.ts). */
  readonly logLevels?: LogLevelMarks
  /**
   * LaunchPlan.kvTransfer: a P/D node's KV transfer backend, `value` as rendered, unless the engine's last `flag` in
   * the command line (an operator's engine.args come after) says another (`of` reads it; absent: the value itself).
   */
  readonly kvTransfer?:
    | { readonly value: string; readonly flag: string; readonly of?: (flagValue: string) => string | undefined }
    | undefined
}

/**
 * `[engine].command` with a first word `node` meaning the Node that runs the agent (process.execPath): the
 * simulator and other Node engines then run on the agent's Node 24, not on whatever `node` is first on PATH.
 */
export const resolveCommand = (command: ReadonlyArray<string>, execPath: string): ReadonlyArray<string> =>
  command[0] === "node" ? [execPath, ...command.slice(1)] : command

/** Builds the LaunchPlan of a spawned engine. */
export const assemble = (config: AgentConfig, listen: Listen, parts: PlanParts): LaunchPlan => {
  const env = { ...parts.env, ...config.engine.env }
  const args = [...parts.args, ...config.model.args, ...config.engine.args]
  const transfer = parts.kvTransfer
  const given = transfer === undefined ? undefined : lastFlagValue(args, transfer.flag)
  const kvTransfer =
    transfer === undefined || given === undefined
      ? transfer?.value
      : transfer.of === undefined
        ? given
        : (transfer.of(given) ?? transfer.value)
  return {
    kind: config.engine.kind,
    spawns: true,
    argv: [
      ...(config.engine.command === undefined
        ? parts.executable
        : resolveCommand(config.engine.command, process.execPath)),
      ...args
    ],
    env,
    baseUrl: listen.baseUrl,
    host: listen.host,
    port: listen.port,
    probe: parts.probe,
    liveness: livenessOf(config, listen, parts.liveness, parts.probe),
    ...(parts.livenessTimeoutFloorMs !== undefined ? { livenessTimeoutFloorMs: parts.livenessTimeoutFloorMs } : {}),
    metrics: parts.metrics,
    kvEvents: parts.kvEvents,
    servedModel: config.model.served_name,
    requestModel: parts.requestModel ?? config.model.served_name,
    ...(parts.warnings !== undefined && parts.warnings.length > 0 ? { warnings: parts.warnings } : {}),
    ...(parts.cpuCache !== undefined ? { cpuCache: parts.cpuCache } : {}),
    ...(parts.environmentNeed !== undefined ? { environmentNeed: parts.environmentNeed } : {}),
    ...(parts.exitHints !== undefined && parts.exitHints.length > 0 ? { exitHints: parts.exitHints } : {}),
    ...(parts.logLevels !== undefined ? { logLevels: parts.logLevels } : {}),
    ...(kvTransfer !== undefined ? { kvTransfer } : {})
  }
}

/** `[flag, value]` when the value is set, else nothing: for optional model settings. */
export const optionalFlag = (flag: string, value: number | string | undefined): ReadonlyArray<string> =>
  value === undefined ? [] : [flag, String(value)]
