/**
 * Whether a record in agent.state_dir (the engine pid file, the state_dir lock) still names the process it recorded:
 * pids are reused, so the record keeps the process's start and /proc's start must match it. Pure, and free of
 * Effect: the pid file's reclaim (layers/engine/pidFile.ts) and the lock's verdict (LockVerdict.ts) share it.
 */

/**
 * How far a recorded start may be from a process's start as /proc tells it for the record to name that process:
 * an engine's start is the agent's clock at the spawn (the guard starts it a moment later), and /proc's boot
 * time moves when the clock is stepped. Pids are reused, so a record whose pid started at another time names
 * someone else.
 */
export const START_MATCH_MS = 15_000

/** Whether a process that started at `actualMs` (/proc) can be the one recorded as started at `recordedMs`. */
export const startMatches = (actualMs: number | undefined, recordedMs: number | undefined): boolean =>
  actualMs === undefined || recordedMs === undefined || Math.abs(actualMs - recordedMs) <= START_MATCH_MS
