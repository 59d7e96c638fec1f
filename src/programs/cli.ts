/**
 * The `cgn-agent` command line: the root command and its subcommands, and the exit-code policy.
 * Adding a subcommand is one entry in `subcommands`. Exit codes: 0 ok, 2 invalid config (a
 * ConfigError, including a missing --config), 1 anything else (usage errors included).
 */
import { Console, Effect } from "effect"
import { CliError, Command } from "effect/cli"
import { ConfigError } from "../services/Config.ts"
import { check } from "./check.ts"
import { generate } from "./generate.ts"
import { render } from "./render.ts"
import { run } from "./run.ts"

/** The version `--version` prints. */
export const VERSION = "0.1.0"

/** Every subcommand of `cgn-agent`, in the order `--help` lists them. */
export const subcommands = [run, check, render, generate] as const

/** The root command. */
export const cgnAgent = Command.make("cgn-agent").pipe(
  Command.withDescription(
    "Per-GPU-host agent of the cgn serving stack: supervises one inference engine, relays Generate over gRPC, registers in etcd"
  ),
  Command.withSubcommands(subcommands)
)

/** Runs the CLI on `args` (argv without node and script) and yields the process exit code. */
export const runCli = (args: ReadonlyArray<string>) =>
  Command.runWith(cgnAgent, { version: VERSION })(args).pipe(
    Effect.as(0),
    Effect.catch((e: unknown) => {
      if (e instanceof ConfigError) return Effect.as(Console.error(e.message), 2)
      // effect/cli has already printed usage errors with the command's help.
      if (CliError.isCliError(e)) return Effect.succeed(1)
      return Effect.as(Console.error(`cgn-agent: ${e instanceof Error ? e.message : String(e)}`), 1)
    })
  )
