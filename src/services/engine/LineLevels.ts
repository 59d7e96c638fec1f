/**
 * The level an engine marks a line of its output with, read as backend data (LaunchPlan.logLevels: each backend's in
 * layers/engine/backends/logMarks.ts), so that the agent logs the line at the engine's own level: its warnings and
 * errors stay seen at log_level = "warn", its per-request chatter (llama-server's slot lines, ~8 a request) goes with
 * info. Pure.
 */

/** The agent's level for an engine line. */
export type EngineLineLevel = "debug" | "info" | "warn" | "error"

/**
 * How to read an engine's level marks: `pattern`, a RegExp's source, is matched against the line's start once ANSI
 * colour codes are taken out (an engine may colour its prefix: llama-server's `--log-colors on`, vLLM's process
 * prefix); the first of its capturing groups that matched is the mark, looked up in `levels`. Plain data: a launch
 * plan carries it through JSON.
 */
export interface LogLevelMarks {
  readonly pattern: string
  readonly levels: Readonly<Record<string, EngineLineLevel>>
}

/** How much of a line's start is read for its mark: every engine's prefix is far shorter, colour codes and all. */
const HEAD_CHARS = 256

/** ANSI SGR sequences (colours, bold, reset), which an engine's prefix may carry. */
const SGR = /\x1b\[[0-9;]*m/g

/**
 * The reader of one engine's marks (its RegExp compiled once per run): a line's level, info for a line with no mark
 * of `marks` (a traceback, a progress bar, a line the engine prints without its logger) and for every line of an
 * engine with none known.
 */
export const lineLevelReader = (marks: LogLevelMarks | undefined): ((line: string) => EngineLineLevel) => {
  if (marks === undefined) return () => "info"
  const rx = new RegExp(marks.pattern)
  return (line) => {
    const m = rx.exec(line.slice(0, HEAD_CHARS).replace(SGR, ""))
    const mark = m?.slice(1).find((g) => g !== undefined)
    return (mark !== undefined && Object.hasOwn(marks.levels, mark) ? marks.levels[mark] : undefined) ?? "info"
  }
}
