/**
 * agent.state_dir made ready for the start: created if need be, and refused unless it is the agent's own (the rule
 * is stateFiles.ts stateDirDistrust). The state_dir lock (stateLock.ts) runs it before it takes the lock.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { EngineProcessError } from "../../services/engine/EngineProcess.ts"
import { makeDirs } from "./makeDirs.ts"
import { stateDirLine } from "./stateDirChecks.ts"
import { DIR_MODE, stateDirDistrust } from "./stateFiles.ts"

/** How long creating agent.state_dir may take before the start is refused. */
const STATE_DIR_TIMEOUT_MS = 10_000

/**
 * Creates agent.state_dir (mode 0700, and its parents) if need be and checks that it is the agent's own
 * (stateFiles.ts; `check`'s preflight said so before the start, this holds for the directory as made); a failure,
 * or no answer in time, refuses the start.
 */
export const ensureStateDir = (stateDir: string): Effect.Effect<void, EngineProcessError> =>
  Effect.tryPromise({
    // Resolved as path.join resolves the names of the files in it: a `..` after a link in state_dir made the
    // directory through the link while the files went to the lexical path (a re-check's stray directory).
    try: () => makeDirs(path.resolve(stateDir), fs, DIR_MODE),
    catch: (err) =>
      new EngineProcessError({
        reason: "StateDir",
        detail: stateDirLine(stateDir, `cannot create it: ${err instanceof Error ? err.message : String(err)}`)
      })
  }).pipe(
    Effect.andThen(Effect.promise(() => stateDirDistrust(stateDir))),
    Effect.flatMap((why) =>
      why === undefined
        ? Effect.void
        : Effect.fail(new EngineProcessError({ reason: "StateDir", detail: stateDirRefusal(stateDir, why) }))
    ),
    // Bounded: a hung network mount must not hold the start with no word (makeDirs.ts ends where Node's
    // recursive mkdir spun). A local directory takes milliseconds.
    Effect.timeoutOrElse({
      duration: STATE_DIR_TIMEOUT_MS,
      orElse: () =>
        Effect.fail(
          new EngineProcessError({
            reason: "StateDir",
            detail: stateDirLine(stateDir, `cannot create it: no answer within ${STATE_DIR_TIMEOUT_MS / 1000} s`)
          })
        )
    })
  )

/** Why agent.state_dir is refused, with the remedy (the preflight, programs/check.ts, says the same). */
export const stateDirRefusal = (stateDir: string, why: string): string =>
  `agent.state_dir = "${stateDir}" is not the agent's own: ${why}; the agent trusts what it finds there (the engine pid file names a process group it stops), so it must be owned by the agent's user or root and writable by its owner only (chmod 700), and not shared with less-trusted pods or users`
