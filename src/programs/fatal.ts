/**
 * How `run` ends on an error once its logging is configured: the error is written as one log line of the agent's
 * shape (layers/observability/Logging.ts: `{"ts","level":"fatal","msg",...}`, the message naming the key and the
 * reason as the plain line did), not as plain text after the JSON lines, so a log collector that parses every line
 * keeps the one that says why the agent is gone. The exit code stays the one cli.ts gives that error (2 for a
 * ConfigError, 1 for any other); cli.ts prints nothing more for it.
 *
 * Errors before logging is configured (the config file, `check`'s preflight) stay the plain lines the README
 * documents under the exit codes: there is no level or shape to match yet.
 */
import { Data, Effect } from "effect"
import type { LogLevel } from "effect/LogLevel"
import * as Logging from "../layers/observability/Logging.ts"
import { ConfigError } from "../services/config/Config.ts"
import type { LogLevels } from "../services/config/ConfigSchema.ts"
import { EngineProcessError } from "../services/engine/EngineProcess.ts"
import { descriptorAdvice, descriptorRemedy, descriptorShortage } from "../services/node/HostShortage.ts"

/** An error `run` has already written as its last log line: cli.ts exits with `exitCode`, printing nothing. */
export class FatalLogged extends Data.TaggedError("FatalLogged")<{ readonly exitCode: number }> {}

/** The process's exit code for an error that ends a command: 2 for an invalid config, 1 for anything else. */
export const exitCodeOf = (e: unknown): number => (e instanceof ConfigError ? 2 : 1)

/** The error as one line: a ConfigError's problems joined (its own message is one line per problem). */
export const fatalMessage = (e: unknown): string => {
  if (e instanceof ConfigError) return `invalid config ${e.file}: ${e.problems.join("; ")}`
  // state_dir (its lock, the directory) is the agent's: the detail names the key, "engine process:" would mislead
  if (e instanceof EngineProcessError && e.reason === "StateDir") return e.detail
  return e instanceof Error ? e.message : String(e)
}

/**
 * A defect (a throw no error type says, a bug) as one line: out of descriptors, which any open or socket may meet,
 * in the agent's words without a stack; anything else as an internal error, its stack a field of the same line.
 */
export const defectLine = (defect: unknown): { readonly msg: string; readonly stack?: string } => {
  const shortage = descriptorShortage(defect)
  const message = defect instanceof Error ? defect.message : String(defect)
  if (shortage !== undefined)
    return {
      msg: message.includes(shortage)
        ? `${message}: ${descriptorRemedy(shortage)}`
        : `${message}: ${descriptorAdvice(shortage)}`
    }
  const stack = defect instanceof Error ? defect.stack : undefined
  return { msg: `internal error (a defect of the agent's): ${message}`, ...(stack === undefined ? {} : { stack }) }
}

/**
 * Runs `self` under the daemon's logging (the same level rules as its own), and writes a failure as a `fatal` log
 * line with the exit code it gets, failing with FatalLogged; a defect too (exit 1), which would otherwise be printed
 * by the runtime's teardown as plain text with a stack, after the JSON lines. An interruption (a signal while starting)
 * passes through, to `saidIfStoppedWhileStarting`, which `run` puts around its whole start.
 */
export const logFatal =
  (configured: (typeof LogLevels)[number], flag: LogLevel | undefined) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, FatalLogged, R> =>
    self.pipe(
      Effect.catch((e: E) => {
        const exitCode = exitCodeOf(e)
        return Effect.logFatal(fatalMessage(e), { exit_code: exitCode }).pipe(
          Effect.andThen(Effect.fail(new FatalLogged({ exitCode })))
        )
      }),
      // after Effect.catch, which would otherwise take the FatalLogged this fails with for a second line
      Effect.catchDefect((defect) => {
        const { msg, stack } = defectLine(defect)
        return Effect.logFatal(msg, { exit_code: 1, ...(stack === undefined ? {} : { stack }) }).pipe(
          Effect.andThen(Effect.fail(new FatalLogged({ exitCode: 1 })))
        )
      }),
      Effect.provide(Logging.layer(configured, flag))
    )

/**
 * The one place that says a signal ended `run`'s start. A SIGTERM or SIGINT before the daemon routes them to its
 * drain (runMain.ts interrupts the main fiber then) ends the start with exit 130: said as the last line, instead of
 * nothing after the start's own lines. Put around all of the start, not the daemon alone: the config's load,
 * `preflight` (a TLS file on a slow mount) and the state_dir checks come first, and a signal there ended with exit
 * 130 and no line (a lifecycle review). `configured`: the config's log level once it is read, else undefined (the
 * schema's default, info, with CGN_LOG_LEVEL and `--log-level` over it as for every line).
 */
export const saidIfStoppedWhileStarting =
  (configured: () => (typeof LogLevels)[number] | undefined, flag: LogLevel | undefined) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.onInterrupt(self, () =>
      Effect.logInfo("cgn-agent stopped by a signal while starting: nothing was served yet; its start undone", {
        exit_code: 130
      }).pipe(Effect.provide(Logging.layer(configured() ?? "info", flag)))
    )
