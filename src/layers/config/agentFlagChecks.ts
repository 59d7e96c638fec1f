/**
 * engine.args and models.x.args against the flags the agent renders from the config and relies on (pure; the flags
 * are the backend's data, capabilities.agentFlags; the rule and its words are services/engine/AgentFlags.ts).
 */
import type { ConfigFile } from "../../services/config/ConfigSchema.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { agentFlagProblems } from "../../services/engine/AgentFlags.ts"
import { engineOf } from "../engine/backends/index.ts"

/** One problem per setting an args list gives again; the key to set named with its model's table. */
export const agentFlagArgProblems = (c: ConfigFile): Array<string> => {
  const caps = engineOf(c).capabilities
  const owned = caps.agentFlags ?? []
  if (owned.length === 0) return []
  const models = Object.keys(c.models)
  const keyed = (model: string | undefined) =>
    model === undefined
      ? owned
      : owned.map((o) => ({
          ...o,
          key: o.key.replace("<name>", formatPath(["models", model]).slice("models.".length))
        }))
  return [
    ...agentFlagProblems(
      "engine.args",
      c.engine.args,
      keyed(models.length === 1 ? models[0] : undefined),
      caps.displayName
    ),
    ...models.flatMap((model) =>
      agentFlagProblems(
        formatPath(["models", model, "args"]),
        c.models[model]?.args ?? [],
        keyed(model),
        caps.displayName
      )
    )
  ]
}
