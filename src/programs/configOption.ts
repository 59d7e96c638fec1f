/**
 * The `--config PATH` flag every subcommand that needs a config shares, and loading the file it names
 * (falling back to CGN_AGENT_CONFIG). A missing path is a ConfigError, so it exits 2 like a bad file.
 */
import { Effect, Option } from "effect"
import { Flag } from "effect/cli"
import { loadConfigFile } from "../layers/config/Config.ts"
import type { AgentConfig } from "../services/config/Config.ts"
import { ConfigError } from "../services/config/Config.ts"

/** `--config PATH`; optional on the command line because CGN_AGENT_CONFIG may name the file instead. */
export const configFlag = Flag.String("config").pipe(
  Flag.withMetavar("PATH"),
  Flag.withDescription("The agent's TOML config file (default: $CGN_AGENT_CONFIG)"),
  Flag.optional
)

/** The path from the flag, else CGN_AGENT_CONFIG, else a ConfigError saying how to give one. */
export const configPath = (flag: Option.Option<string>): Effect.Effect<string, ConfigError> =>
  Effect.suspend(() => {
    const given = Option.getOrUndefined(flag)
    // `--config=` or `--config ""` (an unset shell variable, most often): say so, rather than fail to open "".
    if (given !== undefined && given.trim() === "")
      return Effect.fail(
        new ConfigError({
          file: JSON.stringify(given),
          problems: ["--config: the path is empty; pass --config PATH (an unset variable in --config=$VAR?)"]
        })
      )
    const path = given ?? (process.env.CGN_AGENT_CONFIG || undefined)
    if (path !== undefined) return Effect.succeed(path)
    return Effect.fail(
      new ConfigError({
        file: "(none)",
        problems: ["--config: no config file given; pass --config PATH or set CGN_AGENT_CONFIG"]
      })
    )
  })

/** Reads and validates the config named by the flag or the environment. */
export const loadConfig = (flag: Option.Option<string>): Effect.Effect<AgentConfig, ConfigError> =>
  Effect.flatMap(configPath(flag), loadConfigFile)
