/**
 * The `cgn-agent` command line: the root command and its subcommands, and the exit-code policy.
 * Adding a subcommand is one entry in `subcommands`. Exit codes: 0 ok, 2 invalid config (a
 * ConfigError, including a missing --config), 1 anything else (usage errors included).
 */
import { Console, Effect, Option } from "effect"
import { Argument, CliError, CliOutput, Command } from "effect/cli"
import { ConfigError } from "../services/config/Config.ts"
import { VERSION } from "../version.ts"
import { check } from "./check.ts"
import { FatalLogged } from "./fatal.ts"
import { generate } from "./generate.ts"
import { render } from "./render.ts"
import { run } from "./run.ts"

/** The version `--version` prints. */
export { VERSION }

/** `cgn-agent help [COMMAND]`: the same text as `cgn-agent [COMMAND] --help`. */
const help = Command.make(
  "help",
  { command: Argument.String("command").pipe(Argument.withDescription("A subcommand"), Argument.optional) },
  ({ command }) => Effect.suspend(() => runRoot([...Option.toArray(command), "--help"]))
).pipe(Command.withDescription("Print the help of cgn-agent or of one subcommand"))

/** `cgn-agent version`: the same line as `cgn-agent --version`. */
const version = Command.make("version", {}, () => Console.log(`cgn-agent v${VERSION}`)).pipe(
  Command.withDescription("Print the version")
)

/** Every subcommand of `cgn-agent`, in the order `--help` lists them. */
export const subcommands = [run, check, render, generate, help, version] as const

/** The root command. */
export const cgnAgent = Command.make("cgn-agent").pipe(
  Command.withDescription(
    "Per-GPU-host agent of the cgn serving stack: supervises one inference engine, relays Generate over gRPC, registers in etcd"
  ),
  Command.withSubcommands(subcommands)
)

/**
 * A usage error's text on one line. effect/cli puts its suggestions for a mistyped subcommand or flag on lines of
 * their own after a blank one (effect cli/CliError.ts, UnknownSubcommand and UnrecognizedOption `message`:
 * "...\n\n  Did you mean this?\n    check"); the suggestions are kept, on the same line.
 */
const oneLine = (e: CliError.NonShowHelpErrors): string => {
  const suggestions = "suggestions" in e ? e.suggestions : []
  if (suggestions.length === 0) return e.message.replace(/\s*\n\s*/g, " ")
  return `${e.message.split("\n", 1)[0]}; did you mean ${suggestions.join(" or ")}?`
}

/** The one line for a command line with no subcommand: what to add, and where the help is. */
export const commandRequired = (path: ReadonlyArray<string>): string => {
  const names = subcommands.map((c) => c.name)
  return `${path.join(" ")}: a command is required: ${names.slice(0, -1).join(", ")} or ${names.at(-1)} (see ${path.join(" ")} --help)`
}

/**
 * A usage error is one line on stderr per problem, pointing at --help (README "Exit codes"): the whole help text on
 * every typo (effect/cli's default) buries the one line that matters. So is a command line with no subcommand
 * (`cgn-agent`, `cgn-agent --log-level debug`): effect/cli shows it as help it was not asked for (`Implicit`, the
 * root has no handler: effect cli/Command.ts `showHelp`), on stdout, and the exit is 1; a script saw a failure
 * with nothing on stderr. Help asked for (`--help`, `help`) and version are presented as usual, on stdout, exit 0.
 */
export const presenter = CliOutput.layerPresenter({
  present: (event) => {
    if (event._tag === "InvalidInvocation") {
      const path = event.commandPath.join(" ")
      return Effect.forEach(event.errors, (e) => Console.error(`${path}: ${oneLine(e)} (see ${path} --help)`))
    }
    // only the root has no handler: its subcommands are the ones to name
    if (event._tag === "Help" && event.reason === "Implicit" && event.commandPath.length === 1)
      return Console.error(commandRequired(event.commandPath))
    return CliOutput.defaultPresenter.present(event)
  }
})

// Annotated: `help` runs the root, which lists `help` among its subcommands.
// A first word that names no subcommand is refused as a usage error, also with --help (`cgn-agent frob --help`,
// `cgn-agent help frob`), where effect/cli would print the root's help and exit 0, so the typo would go unseen.
const runRoot = (args: ReadonlyArray<string>): Effect.Effect<void, unknown, Command.Environment> => {
  const word = args[0] === "help" ? args[1] : args[0]
  const unknown = word !== undefined && !word.startsWith("-") && !subcommands.some((c) => c.name === word)
  return Command.runWith(cgnAgent, { version: VERSION })(unknown ? [word] : args).pipe(Effect.provide(presenter))
}

/**
 * `--wizard` asks its questions on standard input; where that is no terminal (a script, `kubectl exec` without -t)
 * effect/cli's prompt ends at once, "Wizard cancelled.", exit 0: a usage error here, before it starts.
 */
export const wizardWithoutTerminal = (args: ReadonlyArray<string>, stdinIsTerminal: boolean): string | undefined =>
  args.includes("--wizard") && !stdinIsTerminal
    ? "cgn-agent: --wizard asks its questions on a terminal, and standard input is not one (see cgn-agent --help)"
    : undefined

/** Runs the CLI on `args` (argv without node and script) and yields the process exit code. */
export const runCli = (args: ReadonlyArray<string>) => {
  const refused = wizardWithoutTerminal(args, process.stdin.isTTY === true)
  return refused !== undefined ? Effect.as(Console.error(refused), 1) : runCliArgs(args)
}

const runCliArgs = (args: ReadonlyArray<string>) =>
  runRoot(args).pipe(
    Effect.as(0),
    Effect.catch((e: unknown) => {
      // `run` has written it as its last JSON log line already (fatal.ts)
      if (e instanceof FatalLogged) return Effect.succeed(e.exitCode)
      if (e instanceof ConfigError) return Effect.as(Console.error(e.message), 2)
      // effect/cli has already printed usage errors with the command's help.
      if (CliError.isCliError(e)) return Effect.succeed(1)
      return Effect.as(Console.error(`cgn-agent: ${e instanceof Error ? e.message : String(e)}`), 1)
    })
  )
