/**
 * The orphan guard: a tiny launcher between the agent and the engine, so the engine dies with the agent even
 * when the agent is SIGKILLed. Node cannot set PR_SET_PDEATHSIG for its children, so the death of the agent is
 * observed through a pipe instead: the agent spawns this program with stdin as a pipe whose only write end lives
 * in the agent. The kernel closes that end whenever the agent dies, however it dies, and stdin reaches EOF here;
 * the guard then kills the engine's whole process group (one TERM, grace, KILL, confirmed gone) and exits. The
 * guard is the one that signals the group on a stop, whether the agent asked (it closes the lifeline) or died:
 * an engine must get exactly one SIGTERM (see stopGroup). The engine runs in its own group (pgid = its pid,
 * reported on fd 3); it inherits the guard's stdout and stderr, which are the agent's log pipes. Once the agent is
 * gone nobody reads them, so a write fails with EPIPE: every write here ignores errors, or the guard would die
 * between the TERM and the KILL. Contract: services/engine/GuardProtocol.ts. Not part of any public CLI.
 */
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import { groupAlive, KILL_WAIT_MS, signalGroup } from "../layers/engine/processGroup.ts"
import {
  encodeReport,
  type GuardReport,
  parseGuardArgs,
  REPORT_FD,
  type StopOutcome
} from "../services/engine/GuardProtocol.ts"

const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/**
 * Polls until `gone()` or `ms` elapsed; true when gone. The guard is plain Node, so this is its own clock:
 * performance.now, monotonic, so that a wall clock stepped back (NTP at boot) cannot stretch the grace.
 */
const pollUntil = async (gone: () => boolean, ms: number, everyMs = 25): Promise<boolean> => {
  const end = performance.now() + ms
  for (;;) {
    if (gone()) return true
    const now = performance.now()
    if (now >= end) return false
    await delay(Math.min(everyMs, Math.max(end - now, 1)))
  }
}

/**
 * ONE TERM to the group, wait `graceMs` for every member to go, KILL the group, then confirm with a bounded
 * poll. Each step is bounded; nothing here waits on stdio. Called once per group: engines treat a second
 * SIGTERM as "exit now" (llama.cpp tools/server/server.cpp `signal_handler`: "Received second interrupt,
 * terminating immediately"; uvicorn `Server.handle_exit` sets `force_exit` on a second SIGINT). The agent's
 * reclaim runs the same sequence on Effect's Clock (layers/engine/groupWait.ts).
 */
const stopGroup = async (pgid: number, graceMs: number): Promise<StopOutcome> => {
  if (!groupAlive(pgid)) return "gone"
  signalGroup(pgid, "SIGTERM")
  // A stopped process (SIGSTOP, a debugger's stop) keeps the TERM pending until it runs again: continued, it takes
  // it now instead of sitting out the grace to be killed. A running one ignores SIGCONT. systemd does the same
  // (systemd.kill(5), KillSignal=: "right after sending the signal ... systemd will always send SIGCONT").
  signalGroup(pgid, "SIGCONT")
  if (await pollUntil(() => !groupAlive(pgid), graceMs)) return "terminated"
  signalGroup(pgid, "SIGKILL")
  return (await pollUntil(() => !groupAlive(pgid), KILL_WAIT_MS)) ? "killed" : "survived"
}

// A write to a pipe whose reader is gone raises EPIPE as an 'error' event; unhandled, it would kill the guard.
process.stdout.on("error", () => {})
process.stderr.on("error", () => {})
const say = (line: string): void => {
  try {
    process.stderr.write(`[guard] ${line}\n`)
  } catch {
    // nobody is listening any more; the stop goes on regardless
  }
}

const parsed = parseGuardArgs(process.argv.slice(2))
if (typeof parsed === "string") {
  say(parsed)
  process.exit(2)
}
const { graceMs, argv } = parsed

const report = (r: GuardReport): void => {
  try {
    fs.writeSync(REPORT_FD, encodeReport(r))
  } catch {
    // the agent is gone; the lifeline below handles that
  }
}

const [command, ...args] = argv as [string, ...Array<string>]
const engine = spawn(command, args, { detached: true, stdio: ["ignore", "inherit", "inherit"], env: process.env })
let engineExited = false
let shuttingDown = false
const engineDone = new Promise<void>((resolve) => engine.once("exit", () => resolve()))

const shutdown = async (why: string): Promise<void> => {
  if (shuttingDown) return
  shuttingDown = true
  const pgid = engine.pid
  let outcome: StopOutcome = "gone"
  if (pgid !== undefined) {
    if (!engineExited) say(`${why}: stopping engine group ${pgid}`)
    outcome = await stopGroup(pgid, graceMs)
    if (outcome === "survived") say(`engine group ${pgid} survived SIGKILL`)
    // A killed leader is a zombie until we reap it; wait for that (bounded) so its exit status is reported.
    await Promise.race([engineDone, new Promise((resolve) => setTimeout(resolve, 1_000))])
  }
  report({ t: "stopped", outcome })
  process.exit(outcome === "survived" ? 1 : 0)
}

engine.once("spawn", () => {
  if (engine.pid !== undefined) report({ t: "spawned", pid: engine.pid })
})
engine.once("error", (err) => {
  report({ t: "spawn-error", message: err.message })
  process.exit(127)
})
engine.once("exit", (code, signal) => {
  engineExited = true
  report({ t: "exit", code, signal })
  // Workers the engine forked may outlive it and keep GPU memory: the group goes with its leader.
  void shutdown("engine exited")
})

// The lifeline: EOF (or an error) on stdin means the agent is gone or asked for a stop.
process.stdin.on("data", () => {})
process.stdin.once("end", () => void shutdown("lifeline closed (the agent asked for a stop, or is gone)"))
process.stdin.once("error", () => void shutdown("lifeline closed (the agent asked for a stop, or is gone)"))
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"] as const) process.on(sig, () => void shutdown(`guard got ${sig}`))
