/**
 * engine.api_key against the engine (pure): a spawned engine that takes no key is refused one, and a key given to the
 * engine any other way (its flag in engine.args or models.x.args, its variable in engine.env) is refused: the agent
 * sends engine.api_key alone, and a flag replaces the variable the agent sets (vLLM: `args.api_key or VLLM_API_KEY`),
 * so the engine would answer the agent's calls 401. The engine's ways of taking a key are data in its backend
 * (capabilities.apiKey).
 */
import type { ConfigFile } from "../../services/config/ConfigSchema.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { flagSetBy } from "../../services/engine/ArgvFlags.ts"
import { engineOf } from "../engine/backends/index.ts"

/** `keyFrom`: where the agent's key came from (engine.api_key or its variable), undefined when there is none. */
export const engineKeyProblems = (
  c: ConfigFile,
  keyFrom: string | undefined,
  env: Readonly<Record<string, string | undefined>>
): Array<string> => {
  const caps = engineOf(c).capabilities
  if (!caps.spawns) return []
  const name = caps.displayName
  const takes = caps.apiKey
  if (takes === undefined) {
    return keyFrom === undefined
      ? []
      : [
          `${keyFrom}: ${name} takes no API key, so it would serve any caller without one; remove it, and keep engine.url where only the agent reaches it (loopback)`
        ]
  }
  const instead = `set engine.api_key instead: the agent hands it to ${name} and sends it with every call`
  const problems: Array<string> = []
  for (const variable of takes.env) {
    if (c.engine.env[variable] !== undefined)
      problems.push(
        `${formatPath(["engine", "env", variable])}: gives ${name} a key the agent does not send (its calls could be answered 401); ${instead}`
      )
    // The engine inherits the agent's environment; a key there, with none of the agent's own to replace it, is one
    // the engine would ask for and the agent not send (as README once advised for VLLM_API_KEY).
    else if (keyFrom === undefined && env[variable])
      problems.push(
        `${variable}: in the agent's environment, which ${name} inherits: a key the agent does not send (its calls would be answered 401); set CGN_AGENT_ENGINE_API_KEY (or engine.api_key) instead: the agent hands it to ${name} and sends it with every call`
      )
  }
  const argLists: Array<[ReadonlyArray<string>, ReadonlyArray<string>]> = [
    [["engine", "args"], c.engine.args],
    ...Object.entries(c.models).map(([model, m]): [ReadonlyArray<string>, ReadonlyArray<string>] => [
      ["models", model, "args"],
      m.args
    ])
  ]
  for (const [path, args] of argLists) {
    const given = takes.flags.filter((flag) => args.some((a) => flagSetBy(a, takes.flags) === flag))
    if (given.length > 0)
      problems.push(
        `${formatPath(path)}: ${given.join(", ")} gives ${name} a key the agent does not send (its calls could be answered 401); ${instead}`
      )
  }
  return problems
}
