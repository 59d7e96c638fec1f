/**
 * Logging: one JSON object per line on stderr (level, message, annotations, spans, fiber), at the level
 * of `[agent].log_level`, overridden by CGN_LOG_LEVEL. Engine output lines arrive here too, tagged by
 * the supervisor with their stream and run.
 */
import { Layer, Logger, References } from "effect"
import type { LogLevel } from "effect/LogLevel"
import { LogLevels } from "../services/ConfigSchema.ts"

type ConfigLevel = (typeof LogLevels)[number]

const toLogLevel: Record<ConfigLevel, LogLevel> = {
  trace: "Trace",
  debug: "Debug",
  info: "Info",
  warn: "Warn",
  error: "Error"
}

/** The effective level: CGN_LOG_LEVEL when it names a level, else the configured one. */
export const effectiveLevel = (configured: ConfigLevel, env: string | undefined): LogLevel => {
  const fromEnv = env?.toLowerCase()
  const level = LogLevels.find((l) => l === fromEnv) ?? configured
  return toLogLevel[level]
}

/** JSON lines on stderr at the given level, replacing the default logger. */
export const layer = (configured: ConfigLevel): Layer.Layer<never> =>
  Layer.mergeAll(
    Logger.layer([Logger.withConsoleError(Logger.formatJson)]),
    Layer.succeed(References.MinimumLogLevel, effectiveLevel(configured, process.env.CGN_LOG_LEVEL))
  )
