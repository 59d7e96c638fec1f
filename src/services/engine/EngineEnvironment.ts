/**
 * The engine's environment (pure): the agent's own, less the variables that are the agent's alone, plus the plan's
 * (rendered by the backend, then `[engine].env`, which wins over both, so a variable set there is passed even when
 * the table below leaves it out).
 *
 * The agent's own settings (`CGN_AGENT_*`: the admin token, the config path) are not the engine's business, and the
 * admin token would let whatever the engine runs (a model's remote code) drain or restart the node.
 *
 * The image starts the agent with `MALLOC_ARENA_MAX=1`: glibc otherwise gives each thread that allocates (V8's
 * GC and compiler workers) its own arena, whose freed memory stays resident; capping the agent's arenas at one
 * lowered its peak RSS by 10-22 MiB in most bench rows, at the same CPU per token within the bench's swing
 * (docs/bench.md, eleventh session). That is a measurement of a Node relay, not of vLLM's or SGLang's many-threaded Python processes, so
 * the engine does not inherit it; an operator who wants it for the engine sets it in `[engine].env`.
 *
 * The agent's OpenTelemetry settings (`OTEL_*`) configure the agent's own trace export, and the engine's tracing
 * would take them up uninvited: vLLM's worker processes start exporting whenever OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
 * in their environment (vllm-project/vllm vllm/tracing/otel.py, `init_otel_worker`), `OTEL_SERVICE_NAME` would name the
 * engine's spans after the agent, and the OTLP exporters vLLM and SGLang use (opentelemetry-python's, under
 * `--otlp-traces-endpoint`; sgl-project/sglang python/sglang/srt/tracing/trace.py) send
 * OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, the collector's credentials, to whatever endpoint the engine is given. So none
 * is inherited: an operator who has the engine export traces sets its OTEL_* in `[engine].env`, for the engine.
 */

/** What the engine's environment must give it, or it exits at every start (LaunchPlan.environmentNeed). */
export interface EnvironmentNeed {
  readonly met: (env: Readonly<Record<string, string | undefined>>) => boolean
  /** Why the engine cannot start without it, and which keys give it. */
  readonly problem: string
}

/**
 * Variables of the agent's environment that the engine does not inherit: exact names, and prefixes (ending in
 * `*`) for a family.
 */
export const AGENT_PROCESS_VARIABLES: ReadonlyArray<string> = ["MALLOC_ARENA_MAX", "CGN_AGENT_*", "OTEL_*"]

const exact = new Set(AGENT_PROCESS_VARIABLES.filter((n) => !n.endsWith("*")))
const prefixes = AGENT_PROCESS_VARIABLES.filter((n) => n.endsWith("*")).map((n) => n.slice(0, -1))

/** Whether the engine does not inherit the agent's variable of this name. */
export const notInherited = (name: string): boolean => exact.has(name) || prefixes.some((p) => name.startsWith(p))

export const engineEnvironment = (
  agent: Readonly<Record<string, string | undefined>>,
  plan: Readonly<Record<string, string>>
): Record<string, string | undefined> => {
  const env: Record<string, string | undefined> = {}
  for (const [name, value] of Object.entries(agent)) if (!notInherited(name)) env[name] = value
  return Object.assign(env, plan)
}
