/**
 * The engine's environment (pure): the agent's own, less the variables that tune the agent process itself, plus
 * the plan's (rendered by the backend, then `[engine].env`, which wins over both).
 *
 * The image starts the agent with `MALLOC_ARENA_MAX=1`: glibc otherwise gives each thread that allocates (V8's
 * GC and compiler workers) its own arena, whose freed memory stays resident; capping the agent's arenas at one
 * lowered its peak RSS by 10-22 MiB in most bench rows, at the same CPU per token within the bench's swing
 * (docs/bench.md, eleventh session). That is a measurement of a Node relay, not of vLLM's or SGLang's many-threaded Python processes, so
 * the engine does not inherit it; an operator who wants it for the engine sets it in `[engine].env`.
 */

/** Variables of the agent's environment that are settings of the agent process, not passed to the engine. */
export const AGENT_PROCESS_VARIABLES: ReadonlyArray<string> = ["MALLOC_ARENA_MAX"]

export const engineEnvironment = (
  agent: Readonly<Record<string, string | undefined>>,
  plan: Readonly<Record<string, string>>
): Record<string, string | undefined> => {
  const env: Record<string, string | undefined> = { ...agent }
  for (const name of AGENT_PROCESS_VARIABLES) delete env[name]
  return Object.assign(env, plan)
}
