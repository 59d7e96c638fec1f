/**
 * Logging: one JSON object per line on stderr, one shape for every line:
 * `{"ts":"<ISO>","level":"info","msg":"<text>", ...flat fields}`. Fields come from the log call's objects
 * (`Effect.logInfo("text", { key: value })`) and from log annotations; a failure's cause is `cause`. No
 * fiber ids or log spans: they mean nothing to an operator. Engine output lines are
 * `{msg: <line>, engine, stream, run}` (services/engine/ShownLine.ts).
 *
 * The level: `--log-level` on the command line, else CGN_LOG_LEVEL, else `[agent].log_level`.
 */
import { Cause, Console, Effect, Layer, Logger, References } from "effect"
import type { LogLevel, Severity } from "effect/LogLevel"
import * as LogLevelModule from "effect/LogLevel"
import { LogLevels } from "../../services/config/ConfigSchema.ts"
import { LogLevel as LogLevelTag } from "../../services/observability/LogLevel.ts"
import { loadConfigFile } from "../config/Config.ts"

type ConfigLevel = (typeof LogLevels)[number]

const toLogLevel: Record<ConfigLevel, LogLevel> = {
  trace: "Trace",
  debug: "Debug",
  info: "Info",
  warn: "Warn",
  error: "Error"
}

/**
 * The effective level: the command line's `--log-level` when given, else CGN_LOG_LEVEL when it names a
 * level, else the configured one.
 */
export const effectiveLevel = (
  configured: ConfigLevel,
  env: string | undefined,
  flag: LogLevel | undefined = undefined
): LogLevel => {
  if (flag !== undefined) return flag
  const fromEnv = env?.toLowerCase()
  const level = LogLevels.find((l) => l === fromEnv) ?? configured
  return toLogLevel[level]
}

/** Keys every line has; a field of the same name is written with a trailing `_` instead. */
const RESERVED = new Set(["ts", "level", "msg", "cause"])

const isPlainObject = (u: unknown): u is Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u) && !(u instanceof Error)

/** A field value JSON can carry as it is: Errors become their message, bigints strings. */
const jsonValue = (u: unknown): unknown => {
  if (u instanceof Error) return u.message
  if (typeof u === "bigint") return u.toString()
  return u
}

/** What one log call produced, before formatting. */
export interface LogInput {
  readonly date: Date
  readonly level: LogLevel
  /** The log call's arguments (one value, or an array of them). */
  readonly message: unknown
  readonly annotations: Readonly<Record<string, unknown>>
  /** Pretty-printed failure, when the call carried one. */
  readonly cause?: string | undefined
}

/**
 * The one line shape, as an object (pure). Strings in the call join into `msg`; objects' keys become
 * fields, after the annotations (so a call's own field wins); other values are appended to `msg`.
 */
export const logRecord = (input: LogInput): Record<string, unknown> => {
  const parts = Array.isArray(input.message) ? input.message : [input.message]
  const text: Array<string> = []
  const fields: Record<string, unknown> = {}
  const put = (key: string, value: unknown) => {
    if (value === undefined) return
    fields[RESERVED.has(key) ? `${key}_` : key] = jsonValue(value)
  }
  for (const [k, v] of Object.entries(input.annotations)) put(k, v)
  for (const part of parts) {
    if (typeof part === "string") text.push(part)
    else if (isPlainObject(part)) for (const [k, v] of Object.entries(part)) put(k, v)
    else if (part instanceof Error) put("error", part.message)
    else if (part !== undefined) text.push(typeof part === "object" ? JSON.stringify(part) : String(part))
  }
  return {
    ts: input.date.toISOString(),
    level: input.level.toLowerCase(),
    msg: text.join(" "),
    ...fields,
    ...(input.cause === undefined ? {} : { cause: input.cause })
  }
}

const bigintAsString = (_k: string, v: unknown): unknown => (typeof v === "bigint" ? v.toString() : v)

/**
 * JSON.stringify that never throws: a field that cannot be written (a cycle, nesting deeper than the stack) becomes a
 * placeholder, the others are kept. Dropping them all lost an engine line's annotations (`engine`, `stream`, `run`),
 * and a JSON line nested 20,000 deep with a message of its choosing read as one of the agent's own (a re-check).
 */
export const toJson = (record: Record<string, unknown>): string => {
  try {
    return JSON.stringify(record, bigintAsString)
  } catch {
    const kept: Record<string, unknown> = {}
    for (const [k, v] of Object.entries(record)) {
      try {
        JSON.stringify(v, bigintAsString)
        kept[k] = v
      } catch {
        kept[k] = "(not serializable)"
      }
    }
    return JSON.stringify(kept, bigintAsString)
  }
}

/**
 * Characters of log lines written and not yet taken by the stderr reader past which new lines are dropped: UTF-16
 * code units, what process.stderr.writableLength counts for string writes (not UTF-8 bytes: 1 Mi of them is at most
 * 2 MiB of string memory, 3 MiB once encoded, with non-ASCII engine output such as CJK text). Node writes
 * a pipe without blocking (libuv makes it non-blocking, uv_pipe_open): what the reader has not taken waits in
 * process.stderr's memory. A log collector that stalls without closing the pipe (journald under load, a stuck
 * container log driver) grew the agent's memory without bound, an engine's whole output with it (measured: the
 * backlog at 2 MB a second of lines, for as long as the stall lasted). Files and terminals are written
 * synchronously and never have a backlog.
 */
export const MAX_LOG_BACKLOG_CHARS = 1024 * 1024

/** Lines dropped since the last warning, and since the start (cgn_agent_log_lines_dropped_total). */
const drops = { pending: 0, total: 0 }

/** Log lines dropped since the process started because stderr's reader did not take them. */
export const droppedLogLines = (): number => drops.total

/** The warning that says how many lines were dropped since the last one (none when none were), counted as said. */
const dropWarning = (date: Date): string | undefined => {
  if (drops.pending === 0) return undefined
  const line = toJson({
    ts: date.toISOString(),
    level: "warn",
    msg: "log: lines dropped, stderr was not being read",
    dropped: drops.pending,
    backlog_limit_chars: MAX_LOG_BACKLOG_CHARS
  })
  drops.pending = 0
  return line
}

/** Where a stalled stderr is watched: what waits in it, and its reader having taken all of that. */
export interface StderrBacklog {
  /** Characters written and not yet taken by the reader. */
  readonly chars: () => number
  /** Calls `then` once the reader has taken what waited (Node's 'drain'), with a line to write then. */
  readonly caughtUp: (then: (write: (line: string) => void) => void) => void
}

const processStderr: StderrBacklog = {
  chars: () => process.stderr.writableLength,
  caughtUp: (then) => {
    process.stderr.once("drain", () => then((line) => process.stderr.write(`${line}\n`)))
  }
}

/**
 * The logger: `logRecord` of each call at or above `threshold()`, one JSON line on stderr; nothing for the
 * others. The threshold is read per call so a SIGHUP can move it (fibers keep the MinimumLogLevel they started
 * with, so that reference stays at its lowest and this is the filter). While the backlog (characters written and not
 * yet read) is past MAX_LOG_BACKLOG_CHARS a line is dropped and counted; a warning with the count is written as
 * soon as the reader has caught up, or before the next line written, whichever comes first (a quiet agent may log
 * nothing for hours).
 */
export const jsonLines = (
  threshold: () => LogLevel,
  backlog: StderrBacklog = processStderr
): Logger.Logger<unknown, void> => {
  // waiting for the reader: one listener however long the stall, however many lines it drops
  let armed = false
  return Logger.make(({ date, logLevel, message, cause, fiber }) => {
    if (LogLevelModule.isGreaterThan(threshold(), logLevel)) return
    if (backlog.chars() > MAX_LOG_BACKLOG_CHARS) {
      drops.pending++
      drops.total++
      if (!armed) {
        armed = true
        // outside any fiber: the wall clock stamps the warning, as it stamps the lines (Effect's default Clock)
        backlog.caughtUp((write) => {
          armed = false
          const warning = dropWarning(new Date())
          if (warning !== undefined) write(warning)
        })
      }
      return
    }
    const console = fiber.getRef(Console.Console)
    const warning = dropWarning(date)
    if (warning !== undefined) console.error(warning)
    console.error(
      toJson(
        logRecord({
          date,
          level: logLevel,
          message,
          annotations: fiber.getRef(References.CurrentLogAnnotations),
          cause: cause.reasons.length > 0 ? Cause.pretty(cause) : undefined
        })
      )
    )
  })
}

const dropLine = (): void => {}

/**
 * Keeps the daemon up when its log sink goes (the collector's end of the stderr pipe closed, a terminal hung up):
 * every later write then fails (EPIPE for a pipe), raised as an 'error' event on process.stderr a tick later.
 * Node's console listens only during the write call (nodejs/node lib/internal/console/constructor.js,
 * kWriteToConsole), so nobody heard it: it was thrown and ended the agent at its next log line
 * (test/programs/crash-vectors.test.ts). Serving matters more than the log, and there is nowhere left to
 * report it: those lines are dropped. Once per process, never removed: the last lines are written after every
 * layer is released.
 */
const survivePipeLoss = (): void => {
  if (!process.stderr.listeners("error").includes(dropLine)) process.stderr.on("error", dropLine)
}

/**
 * JSON lines on stderr at the effective level, replacing the default logger, and the LogLevel service that
 * moves it (SIGHUP: `hangupReload`). A write to a stderr that is gone is dropped (`survivePipeLoss`).
 */
export const layer = (configured: ConfigLevel, flag?: LogLevel): Layer.Layer<LogLevelTag> => {
  const env = process.env.CGN_LOG_LEVEL
  let threshold = effectiveLevel(configured, env, flag)
  const pinnedBy =
    flag !== undefined ? "--log-level" : LogLevels.some((l) => l === env?.toLowerCase()) ? "CGN_LOG_LEVEL" : undefined
  return Layer.mergeAll(
    Layer.effectDiscard(Effect.sync(survivePipeLoss)),
    Logger.layer([jsonLines(() => threshold)]),
    Layer.succeed(References.MinimumLogLevel, "Trace"),
    Layer.succeed(LogLevelTag, {
      current: Effect.sync(() => threshold),
      configure: (next) =>
        Effect.sync(() => {
          threshold = effectiveLevel(next, env, flag)
          return pinnedBy === undefined ? { level: threshold } : { level: threshold, pinnedBy }
        })
    })
  )
}

/**
 * What SIGHUP does to logging: re-reads `[agent].log_level` from the config file (the rest of the file is
 * not re-applied) and moves the threshold. A file that no longer decodes keeps the current level.
 */
export const hangupReload = (file: string | undefined): Effect.Effect<void, never, LogLevelTag> =>
  Effect.gen(function* () {
    if (file === undefined) return
    const control = yield* LogLevelTag
    const before = yield* control.current
    const read = yield* Effect.result(loadConfigFile(file))
    if (read._tag === "Failure") {
      // `log_level`, not `level`: the line's own level is written under that name
      return yield* Effect.logWarning("SIGHUP: the config file is invalid or unreadable; log level kept", {
        log_level: before.toLowerCase(),
        problem: read.failure.message
      })
    }
    const configured = read.success.agent.log_level
    const { level, pinnedBy } = yield* control.configure(configured)
    // Logged after the new level applies, at that level where it is above info: at info, a raise (info -> warn) hid
    // its own line (a chaos soak); logged before, a lowering (warn -> info) would
    const changeAt: Severity = level === "Warn" || level === "Error" || level === "Fatal" ? level : "Info"
    if (pinnedBy === undefined)
      return yield* Effect.logWithLevel(changeAt)(`SIGHUP: log level ${before.toLowerCase()} -> ${level.toLowerCase()}`)
    // an edit the pin overrides is a warning: at info, the pinned level (warn, say) would hide the only word of it
    if (configured !== level.toLowerCase())
      return yield* Effect.logWarning(
        `SIGHUP: agent.log_level = "${configured}" not applied: the log level stays ${level.toLowerCase()} (set by ${pinnedBy})`
      )
    yield* Effect.logWithLevel(changeAt)(`SIGHUP: log level stays ${level.toLowerCase()} (set by ${pinnedBy})`)
  })
