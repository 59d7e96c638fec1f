/**
 * The engine flags the agent renders from the config and then relies on (pure): where the engine listens, the name
 * it serves, how many GPUs it spans. engine.args and models.x.args come after the rendered flags, and every engine's
 * parser keeps the last value of a repeated flag (argparse; llama.cpp common/arg.cpp), so a second value there would
 * win while the agent went on with the config's: it would wait for an engine on a port the engine never opens (until
 * engine.startup_timeout, 30 minutes by default, with `check` saying ok), send a model name the engine does not
 * serve, or hand the engine GPUs for another parallelism. Refused, naming the config key to set instead. Which flags
 * are the agent's is engine knowledge: the backends' data (capabilities.agentFlags). Flags the agent renders but
 * only reads back (llama-server's `-np`, vLLM's `--kv-transfer-config`) are not among them.
 */
import { flagSetBy } from "./ArgvFlags.ts"

/** One setting the agent renders as a flag of the engine's (every spelling of it) from a config key. */
export interface AgentFlag {
  readonly flags: ReadonlyArray<string>
  /** The config key that sets it. */
  readonly key: string
  /** What a second value in the args would break. */
  readonly breaks: string
}

/** Where the engine listens (every engine's `--host` and `--port`): engine.url. */
export const LISTEN_FLAGS: AgentFlag = {
  flags: ["--host", "--port"],
  key: "engine.url",
  breaks: "the engine would listen where the agent does not look for it"
}

/** What the other settings' second values break, the same for every engine that takes them. */
export const BREAKS = {
  servedName: "the agent's calls would name a model the engine does not serve (each answered 404)",
  tp: "the agent chose the engine's GPUs (CUDA_VISIBLE_DEVICES) for the config's parallelism",
  dp: "the agent chose the engine's GPUs (CUDA_VISIBLE_DEVICES), and reads its ranks (KV events, test completions), for the config's parallelism"
} as const

/**
 * Which of `flags` `arg` sets: a long flag as the engines' parsers read it (ArgvFlags.ts flagSetBy: `=value`, `_` for
 * `-`, an unambiguous prefix), a short one (vLLM's `-tp`, llama-server's `-a`) as written, with or without `=value`.
 */
export const agentFlagSetBy = (arg: string, flags: ReadonlyArray<string>): string | undefined => {
  const long = flagSetBy(
    arg,
    flags.filter((f) => f.startsWith("--"))
  )
  if (long !== undefined) return long
  const name = arg.split("=", 1)[0] ?? arg
  return !name.startsWith("--") && flags.includes(name) ? name : undefined
}

/** The problems of one args list (`path`: its config key), one per setting it gives again, in `owned`'s order. */
export const agentFlagProblems = (
  path: string,
  args: ReadonlyArray<string>,
  owned: ReadonlyArray<AgentFlag>,
  engine: string
): Array<string> =>
  owned.flatMap((o) => {
    const given = [...new Set(args.map((a) => agentFlagSetBy(a, o.flags)).filter((f) => f !== undefined))]
    return given.length === 0
      ? []
      : [
          `${path}: ${given.join(", ")} is set by the agent from ${o.key}, and ${engine} keeps the last value given, so this one would win: ${o.breaks}; set ${o.key} instead`
        ]
  })
