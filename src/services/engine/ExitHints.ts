/**
 * ExitHints: which of the engine's well-known start failures a failed run died of, read from its last lines. The
 * engines name the cause in their own words (vLLM: "No available memory for the cache blocks. Try increasing
 * `gpu_memory_utilization`"); the backend's table (LaunchPlan.exitHints) turns that into the agent's config key.
 * Pure.
 */
import type { ExitHint } from "./Engine.ts"
import type { ExitRecord } from "./EngineProcess.ts"

/**
 * The hint of the first table entry that matches a line, the newest line first: a failure's cause is printed last
 * (a traceback's last line), and an earlier line of the same run can name a cause that was survived or is only a
 * consequence (an engine retrying after a warning, a wrapper exception quoting its root cause). Within a line the
 * table's order decides.
 */
export const matchHint = (table: ReadonlyArray<ExitHint>, lines: ReadonlyArray<string>): string | undefined => {
  for (let i = lines.length - 1; i >= 0; i--) {
    const line = lines[i]!
    const entry = table.find((e) => e.patterns.some((p) => line.includes(p)))
    if (entry !== undefined) return entry.hint
  }
  return undefined
}

/**
 * The hint for a run, only when it ended by itself (`endedBy` exited, as the supervisor records it before any
 * other end) and not cleanly (exit 0 without a signal): a stopped, timed-out or unhealthy run was ended by the
 * agent, and its last lines say nothing about why. And only for a run that never became ready: the tables are start
 * failures, and a run that served has kept every earlier line naming one (keepLine), so a cause it survived at start
 * would be told as the cause of an unrelated crash hours later.
 */
export const exitHint = (
  table: ReadonlyArray<ExitHint> | undefined,
  run: Pick<ExitRecord, "endedBy" | "code" | "signal" | "lastLines"> & { readonly wasReady: boolean }
): string | undefined => {
  if (table === undefined || table.length === 0 || run.endedBy.kind !== "exited" || run.wasReady) return undefined
  if (run.code === 0 && run.signal === null) return undefined
  return matchHint(table, run.lastLines)
}

/** A line of the engine's output as the run keeps it, and whether it names a known cause (a table pattern). */
export interface KeptLine {
  readonly text: string
  readonly cause: boolean
}

/** Cause lines a run keeps past its line count, at most: the newest of them. */
export const CAUSE_LINES_KEPT = 4

/**
 * Appends `text` to a run's kept lines (at most `max`, the oldest going first), except that a line naming a known
 * cause stays while newer ones come (up to CAUSE_LINES_KEPT of them): an engine can print a long traceback after the
 * cause, and vLLM does (the API server's ~40 frames after its EngineCore's error), which pushed the cause out of the
 * last lines, and the hint with it. Pure; `table` is the plan's (none: a plain ring).
 */
export const keepLine = (
  kept: ReadonlyArray<KeptLine>,
  text: string,
  max: number,
  table: ReadonlyArray<ExitHint> | undefined
): ReadonlyArray<KeptLine> => {
  const cause = table?.some((e) => e.patterns.some((p) => text.includes(p))) === true
  const next = [...kept, { text, cause }]
  while (next.length > Math.max(1, max)) {
    const causes = next.reduce((n, l) => n + (l.cause ? 1 : 0), 0)
    // Too many causes: the oldest cause goes; else the oldest other line (all causes: the oldest line).
    const i = causes > CAUSE_LINES_KEPT ? next.findIndex((l) => l.cause) : next.findIndex((l) => !l.cause)
    next.splice(Math.max(i, 0), 1)
  }
  return next
}
