/**
 * The engine pid file in [agent].state_dir and the start-up reclaim: an engine group left by a previous agent
 * (recorded in the file, still alive) is stopped; a live agent that still owns it, or anything else listening
 * on the engine port, refuses the start. Never two engines on the same GPUs.
 */
import * as fs from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { Effect } from "effect"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import { EngineProcessError } from "../../services/engine/EngineProcess.ts"
import { groupAlive, KILL_WAIT_MS, pidAlive, pollUntil, stopGroup } from "./processGroup.ts"

export interface PidRecord {
  readonly agentPid: number
  readonly guardPid: number | undefined
  /** The engine's process group (= the engine leader's pid). */
  readonly pgid: number
  readonly host: string
  readonly port: number
  readonly startedAt: number
}

export const pidFilePath = (stateDir: string): string => path.join(stateDir, "engine.pid")

export const readPidFile = (file: string): PidRecord | undefined => {
  try {
    const v = JSON.parse(fs.readFileSync(file, "utf8")) as Partial<PidRecord>
    return typeof v.pgid === "number" && typeof v.agentPid === "number" ? (v as PidRecord) : undefined
  } catch {
    return undefined
  }
}

/** Written atomically (temp file + rename), so a crash never leaves half a record. */
export const writePidFile = (file: string, record: PidRecord): void => {
  const tmp = `${file}.${process.pid}.tmp`
  fs.writeFileSync(tmp, `${JSON.stringify(record)}\n`)
  fs.renameSync(tmp, file)
}

export const removePidFile = (file: string): void => fs.rmSync(file, { force: true })

/** Whether something accepts TCP connections on host:port (wildcard hosts are checked on loopback). */
export const portInUse = (host: string, port: number, timeoutMs = 1_000): Promise<boolean> => {
  const target = host === "0.0.0.0" || host === "" ? "127.0.0.1" : host === "::" ? "::1" : host
  return new Promise((resolve) => {
    const socket = net.connect({ host: target, port })
    const done = (inUse: boolean) => {
      socket.destroy()
      resolve(inUse)
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.once("connect", () => done(true))
    socket.once("error", () => done(false))
  })
}

/** Prepares a start: state dir exists, a stale engine is stopped, the engine port is free. */
export const reclaim = Effect.fn("EngineProcess.reclaim")(function* (
  plan: LaunchPlan,
  stateDir: string,
  graceMs: number
) {
  const file = pidFilePath(stateDir)
  yield* Effect.try({
    try: () => fs.mkdirSync(stateDir, { recursive: true }),
    catch: (err) => new EngineProcessError({ reason: "StateDir", detail: `cannot create ${stateDir}: ${String(err)}` })
  })
  const stale = readPidFile(file)
  if (stale !== undefined && groupAlive(stale.pgid)) {
    if (stale.agentPid !== process.pid && pidAlive(stale.agentPid)) {
      return yield* new EngineProcessError({
        reason: "AnotherAgent",
        detail: `agent pid ${stale.agentPid} still runs engine group ${stale.pgid} (${file}); stop it first`
      })
    }
    // The dead agent's guard may still be stopping that group (its TERM, grace, KILL): let it finish rather than
    // send the engine a second SIGTERM, which engines take as "exit now" (see stopGroup).
    const guardPid = stale.guardPid
    if (guardPid !== undefined && pidAlive(guardPid)) {
      yield* Effect.logWarning(`waiting for guard pid ${guardPid} to stop engine group ${stale.pgid} (${file})`)
      yield* Effect.promise(() => pollUntil(() => !groupAlive(stale.pgid), graceMs + KILL_WAIT_MS + 1_000))
    }
    yield* Effect.logWarning(`stopping engine group ${stale.pgid} left by agent pid ${stale.agentPid} (${file})`)
    const outcome = yield* Effect.promise(() => stopGroup(stale.pgid, graceMs))
    if (outcome === "survived") {
      return yield* new EngineProcessError({
        reason: "StaleEngine",
        detail: `engine group ${stale.pgid} left by a previous agent survived SIGKILL`
      })
    }
    yield* Effect.logWarning(`stale engine group ${stale.pgid}: ${outcome}`)
  }
  if (stale !== undefined) removePidFile(file)
  if (yield* Effect.promise(() => portInUse(plan.host, plan.port))) {
    return yield* new EngineProcessError({
      reason: "PortBusy",
      detail: `something already listens on ${plan.host}:${plan.port} and it is not an engine this agent started; refusing to start a second engine`
    })
  }
})
