/**
 * The agent's lock on [agent].state_dir, held for the supervisor's lifetime (a resource of its scope). The engine
 * pid file there is one agent's record: a second agent on the same state_dir (a copy started by mistake, a pod
 * overlapping its predecessor) would start an engine while the first one waits between runs, overwrite its record
 * and remove it when its own run ends (so a crash of the first agent would leave an engine nobody reclaims).
 *
 * `agent.lock` says who holds it: pid, that process's start (/proc), its pid namespace and host name. It appears
 * complete or not at all: written to a file of its own, then hard-linked into place, which fails if a lock exists.
 * An existing lock is judged by `lockVerdict` (services/stateDir/LockVerdict.ts): its agent gone, or its pid now
 * another process's, and it is taken over; alive, and the start is refused (AnotherAgent, exit 1, as the pid file's
 * live agent is). A pid means nothing in another pid namespace (a restarted container, a pod sharing a hostPath), so
 * such a lock is judged by its heartbeat: the holder refreshes its mtime every few seconds. The release removes the
 * lock if it is still this holding's.
 */
import { randomUUID } from "node:crypto"
import { readlinkSync } from "node:fs"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Clock, Effect, Schedule } from "effect"
import { EngineProcessError } from "../../services/engine/EngineProcess.ts"
import {
  decodeLock,
  HEARTBEAT_MS,
  HEARTBEAT_STALE_MS,
  type LockRecord,
  lockVerdict
} from "../../services/stateDir/LockVerdict.ts"
import { pidAlive, processStartMs } from "../engine/processGroup.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { ensureStateDir } from "./ensureStateDir.ts"
import { STATE_DIR_ADVICE } from "./stateDirChecks.ts"
import { readNoFollow, writeNew } from "./stateFiles.ts"

export const lockFilePath = (stateDir: string): string => path.join(stateDir, "agent.lock")

const pidNamespace = (): string | undefined => {
  try {
    return readlinkSync("/proc/self/ns/pid")
  } catch {
    return undefined
  }
}

/** A lock record is a few hundred bytes: anything larger is not one. */
const MAX_LOCK_BYTES = 64 * 1024

const code = (err: unknown): string | undefined => (err as NodeJS.ErrnoException | undefined)?.code

/**
 * The lock's text and mtime now; undefined when there is none (removed between a look and the next). Any other
 * failure (a directory or dangling link in its place, a file this user cannot read) fails the start: retrying it
 * would spin for good.
 */
const readLock = (file: string) =>
  Effect.tryPromise({
    try: async () => {
      try {
        const [text, st] = await Promise.all([readNoFollow(file, MAX_LOCK_BYTES), fs.stat(file)])
        return { text, mtimeMs: st.mtimeMs }
      } catch (err) {
        if (code(err) === "ENOENT") return undefined
        throw err
      }
    },
    catch: (err) =>
      new EngineProcessError({ reason: "StateDir", detail: `cannot read ${file}: ${String(err)}; remove it by hand` })
  })

/** The lock's mtime now, or undefined when it cannot be read (then the next look decides). */
const lockMtime = (file: string) =>
  Effect.promise(() =>
    fs.stat(file).then(
      (st) => st.mtimeMs,
      () => undefined
    )
  )

/** How often a contender looks for a refresh of a lock it judges by its heartbeat. */
const REFRESH_POLL_MS = 500

/**
 * Waits until the lock last refreshed at `mtimeMs` is refreshed again (true: its holder lives) or has been silent
 * for HEARTBEAT_STALE_MS (false). A container restarted after a crash finds its predecessor's lock refreshed a
 * few seconds ago: waiting out the rest of the heartbeat takes it over then, where refusing at once would make
 * the new container exit and crash-loop for nothing.
 */
const awaitRefresh = (file: string, mtimeMs: number) =>
  Effect.gen(function* () {
    for (;;) {
      const now = yield* Clock.currentTimeMillis
      const m = yield* lockMtime(file)
      if (m !== undefined && m > mtimeMs) return true
      if (m === undefined || now - mtimeMs >= HEARTBEAT_STALE_MS) return false
      yield* Effect.sleep(Math.min(REFRESH_POLL_MS, HEARTBEAT_STALE_MS - (now - mtimeMs)))
    }
  })

/**
 * Removes the stale lock whose text was `staleText`. Moved aside first and checked: had another contender
 * replaced it meanwhile with its own lock, that one is put back, and the next look at the lock sees it held.
 */
const removeStale = (file: string, staleText: string, aside: string) =>
  Effect.tryPromise({
    try: async () => {
      try {
        await fs.rename(file, aside)
      } catch (err) {
        if (code(err) === "ENOENT") return // gone already: another contender removed it
        throw err
      }
      if ((await readNoFollow(aside, MAX_LOCK_BYTES).catch(() => undefined)) !== staleText)
        await fs.link(aside, file).catch(() => undefined)
      await fs.rm(aside, { force: true }).catch(() => undefined)
    },
    catch: (err) =>
      new EngineProcessError({ reason: "StateDir", detail: `cannot remove the stale ${file}: ${String(err)}` })
  })

/**
 * How old a contender's own lock file (`agent.lock.<token>`, or its `.stale` aside) must be to count as left over:
 * a contender holds its own for at most the heartbeat wait, far less than this.
 */
export const LEFTOVER_MS = 60_000

/**
 * Removes contenders' own lock files that their process left behind (killed between writing one and removing
 * it): nothing else would ever remove them. Run by the holder, so no live contender's file is that old.
 */
const sweepLeftovers = (stateDir: string, file: string) =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const prefix = `${path.basename(file)}.`
    const removed = yield* Effect.promise(async () => {
      const names = await fs.readdir(path.resolve(stateDir)).catch(() => [] as Array<string>)
      const gone: Array<string> = []
      for (const name of names.filter((n) => n.startsWith(prefix))) {
        const at = path.join(stateDir, name)
        const st = await fs.lstat(at).catch(() => undefined)
        if (!st?.isFile() || now - st.mtimeMs <= LEFTOVER_MS) continue
        const rm = await fs.rm(at).catch((err: unknown) => err)
        if (rm === undefined) gone.push(name)
      }
      return gone
    })
    if (removed.length > 0) yield* Effect.logInfo(`removed lock files left by stopped agents: ${removed.join(", ")}`)
  })

/** Takeovers tried before giving up (each one follows a lock judged stale that a contender replaced meanwhile). */
const ATTEMPTS = 3

const fail = (reason: "StateDir" | "AnotherAgent", detail: string) =>
  Effect.fail(new EngineProcessError({ reason, detail }))

/**
 * The lock file cannot be written in state_dir (full, read-only, gone): named by the key, as `check` names it
 * (stateDirChecks.ts), since state_dir is the agent's and not the engine's (programs/fatal.ts drops the prefix).
 */
const unwritable = (stateDir: string, what: string, err: unknown) =>
  new EngineProcessError({
    reason: "StateDir",
    detail: `agent.state_dir = "${stateDir}": cannot write ${what}: ${err instanceof Error ? err.message : String(err)}; free space there or ${STATE_DIR_ADVICE}`
  })

/** Takes the lock (failing with AnotherAgent while a live agent holds it); the release removes it. */
const take = (stateDir: string, file: string, text: string, token: string) =>
  Effect.gen(function* () {
    const own = `${file}.${token}`
    yield* Effect.tryPromise({
      // new, mode 0600, never through a link (stateFiles.ts); the name has a random UUID
      try: () => writeNew(own, text),
      catch: (err) => unwritable(stateDir, `the agent's lock ${own}`, err)
    })
    const self = { pid: process.pid, pidNs: pidNamespace(), host: os.hostname() }
    const judge = (held: { readonly text: string; readonly mtimeMs: number }) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const record = decodeLock(held.text)
        const pid = record?.pid ?? 0
        return lockVerdict(record, {
          self,
          alive: pidAlive(pid),
          startMs: processStartMs(pid),
          ageMs: now - held.mtimeMs
        })
      })
    // Each pass that finds the lock gone, or takes a stale one over, and then loses the race for it counts.
    for (let attempt = 1; ; attempt++) {
      const linked = yield* Effect.promise(() =>
        fs.link(own, file).then(
          () => undefined,
          (err: unknown) => err
        )
      )
      if (linked === undefined) return yield* sweepLeftovers(stateDir, file)
      if (code(linked) !== "EEXIST") return yield* Effect.fail(unwritable(stateDir, `the agent's lock ${file}`, linked))
      if (attempt > ATTEMPTS)
        return yield* fail("StateDir", `cannot take ${file}: other agents keep taking and releasing it`)
      let held = yield* readLock(file)
      if (held === undefined) continue // released between the link and the read: try again
      let verdict = yield* judge(held)
      // The wait (up to HEARTBEAT_STALE_MS, inside the uninterruptible acquire) may be interrupted: a drain during it
      // ends the start at once.
      if (verdict._tag === "Held" && verdict.heartbeat) {
        yield* Effect.logWarning(
          `${file} is held by ${verdict.by}: waiting up to ${HEARTBEAT_STALE_MS / 1000} s from its last refresh for it to go silent`
        )
        if (!(yield* Effect.interruptible(awaitRefresh(file, held.mtimeMs)))) {
          // Silent for the whole heartbeat: judged again now, so it is stale unless it was replaced meanwhile.
          held = yield* readLock(file)
          if (held === undefined) continue
          verdict = yield* judge(held)
        }
      }
      if (verdict._tag === "Held")
        return yield* fail(
          "AnotherAgent",
          `agent.state_dir ${stateDir} is held by ${verdict.by} (${file}); two agents on one state_dir would stop each other's engine: stop that agent or give this one its own state_dir`
        )
      yield* removeStale(file, held.text, `${own}.stale`)
      yield* Effect.logWarning(`taking over ${file}: ${verdict.why}`)
    }
  }).pipe(Effect.ensuring(Effect.promise(() => fs.rm(`${file}.${token}`, { force: true }).catch(() => undefined))))

/**
 * Removes the lock if it is still this holding's. A removal that fails (a read-only or busy state_dir) is logged
 * and left to the next agent, which takes over a lock whose holder is gone: as a defect (Effect.promise) it made
 * the end of a clean drain exit 1.
 */
const release = (file: string, text: string) =>
  Effect.tryPromise(async () => {
    if ((await readNoFollow(file, MAX_LOCK_BYTES).catch(() => undefined)) === text) await fs.rm(file, { force: true })
  }).pipe(
    Effect.catch((e) =>
      Effect.logWarning(`could not remove ${file}; the next agent takes it over`, { error: String(e.cause) })
    )
  )

/** This process's holdings, by lock file (resolved): the token each wrote. */
const holdings = new Map<string, string>()

/**
 * Whether this process holds `stateDir`'s lock now: it took it, and the lock there is still that holding's. What
 * another concern may rely on the lock for (layers/registry/leaseRecord.ts: only one agent at a time on state_dir).
 */
export const stateDirHeldHere = async (stateDir: string): Promise<boolean> => {
  const file = lockFilePath(stateDir)
  const token = holdings.get(path.resolve(file))
  const text = token === undefined ? undefined : await readNoFollow(file, MAX_LOCK_BYTES).catch(() => undefined)
  return text !== undefined && decodeLock(text)?.token === token
}

/**
 * Holds agent.state_dir (created if need be) for the scope's lifetime, refreshing the lock's mtime for agents in
 * other pid namespaces; fails with AnotherAgent while another agent holds it.
 */
export const holdStateDir = Effect.fn("EngineProcess.holdStateDir")(function* (stateDir: string) {
  yield* ensureStateDir(stateDir)
  const file = lockFilePath(stateDir)
  const token = randomUUID()
  const record: LockRecord = {
    pid: process.pid,
    startedAt: processStartMs(process.pid),
    pidNs: pidNamespace(),
    host: os.hostname(),
    token
  }
  const text = `${JSON.stringify(record)}\n`
  const key = path.resolve(file)
  yield* Effect.acquireRelease(
    Effect.tap(take(stateDir, file, text, token), () => Effect.sync(() => holdings.set(key, token))),
    () =>
      Effect.andThen(
        Effect.sync(() => holdings.delete(key)),
        release(file, text)
      )
  )
  const refresh = Effect.gen(function* () {
    const now = new Date(yield* Clock.currentTimeMillis)
    yield* Effect.promise(() => fs.utimes(file, now, now).catch(() => undefined))
  })
  yield* refresh.pipe(
    Effect.repeat(Schedule.spaced(HEARTBEAT_MS)),
    background(
      "the state_dir lock's refresh",
      `${file} is no longer refreshed: an agent in another pid namespace may take it over as stale`,
      { restart: RESTART }
    ),
    Effect.forkScoped
  )
})
