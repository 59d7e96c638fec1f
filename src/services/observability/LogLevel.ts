/**
 * LogLevel: the daemon's log threshold, which a SIGHUP can change without a restart. Its source, in order:
 * `--log-level`, CGN_LOG_LEVEL, `[agent].log_level`; a SIGHUP re-reads only the last (the first two are
 * fixed for the process's life, so while one is set it stays in charge).
 */
import { Context, type Effect } from "effect"
import type { LogLevel as Level } from "effect/LogLevel"
import type { LogLevels } from "../config/ConfigSchema.ts"

export type ConfigLogLevel = (typeof LogLevels)[number]

export interface LogLevelService {
  readonly current: Effect.Effect<Level>
  /** Applies a new `[agent].log_level`; the effective level and what decided it. */
  readonly configure: (
    configured: ConfigLogLevel
  ) => Effect.Effect<{ readonly level: Level; readonly pinnedBy?: string }>
}

export class LogLevel extends Context.Service<LogLevel, LogLevelService>()("cgn-agent/LogLevel") {}
