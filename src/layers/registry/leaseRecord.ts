/**
 * The lease record: `etcd-lease` in agent.state_dir names the lease this node's agent holds its key under, so the
 * next agent on the node can tell its predecessor's lease from anyone else's. An agent killed before its revoke
 * (SIGKILL, the OOM killer) leaves its key, saying "ready", for up to agent.lease_ttl (longer across an etcd restart,
 * which extends every lease); its successor found the key held and waited that long unregistered while routers read
 * the dead agent's record. A key held by exactly the lease the record names was put there by this node's previous
 * agent: the new one revokes that lease and registers at once. Any other holder is waited for, as before.
 *
 * The record proves that much only while one agent at a time holds state_dir: the state_dir lock
 * (layers/stateDir/stateLock.ts), taken by an agent that spawns its engine. An agent that does not hold it (a proxied
 * engine: openai_compat without a spawn) may share state_dir with a live agent, so it neither reads nor writes the
 * record. The record is written after each lease grant (temp file and rename, 0600, synced: durableFile.ts), removed
 * once the agent revoked its own lease at a clean stop; a write or removal that fails is a warning, never fatal.
 */
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { epochOf } from "../../services/registry/HealthReporter.ts"
import { writeDurably } from "../stateDir/durableFile.ts"
import { readNoFollow, sweepTemps } from "../stateDir/stateFiles.ts"
import { stateDirHeldHere } from "../stateDir/stateLock.ts"
import { reasonOf } from "./etcdErrors.ts"

export const leaseRecordPath = (stateDir: string): string => path.join(stateDir, "etcd-lease")

/** A record is one lease id and its key: anything larger is not one. */
const MAX_RECORD_BYTES = 4096
/** How long one read, write or removal may take: a hung state_dir (a network mount) must not hold registration. */
const IO_BOUND_MS = 2_000
/** The removal's, at a clean stop (a term of the shutdown's bound, programs/shutdownBound.ts). */
export const REMOVE_BOUND_MS = 250

export interface LeaseRecord {
  /** The lease this node's previous agent recorded (decimal, as etcd gives ids), when this agent may act on it. */
  readonly previous: string | undefined
  /** Records a lease just granted (decimal id). */
  readonly write: (leaseId: string) => Effect.Effect<void>
  /** Removes the record: its lease was revoked by this agent. */
  readonly remove: Effect.Effect<void>
  /** Why a holder's lease other than `previous` is not revoked: the record names another lease, none, or this agent keeps none. */
  readonly notRevoked: string
}

/** The record of an agent that keeps none (no state_dir lock, or a test's reporter without one). */
export const noLeaseRecord = (why: string): LeaseRecord => ({
  previous: undefined,
  write: () => Effect.void,
  remove: Effect.void,
  notRevoked: why
})

/** The lease id a record's text names (decimal), or undefined when it is not a record. */
export const decodeLeaseRecord = (text: string): string | undefined => {
  try {
    const lease = (JSON.parse(text) as { lease?: unknown }).lease
    return typeof lease === "string" && /^[1-9]\d{0,19}$/.test(lease) ? lease : undefined
  } catch {
    return undefined
  }
}

const bounded = <A>(what: string, f: () => Promise<A>, ms = IO_BOUND_MS) =>
  Effect.tryPromise({ try: f, catch: reasonOf }).pipe(
    Effect.timeoutOrElse({
      duration: ms,
      orElse: () => Effect.fail(`${what} took more than ${ms} ms`)
    })
  )

/**
 * The lease record of an agent on `stateDir` for the node key `key`: read once here, before this agent's first grant
 * replaces it. Never fails.
 */
export const makeLeaseRecord = Effect.fnUntraced(function* (stateDir: string, key: string) {
  const file = leaseRecordPath(stateDir)
  const held = yield* bounded("reading the state_dir lock", () => stateDirHeldHere(stateDir)).pipe(
    Effect.orElseSucceed(() => false)
  )
  if (!held)
    return noLeaseRecord(
      `this agent does not hold agent.state_dir's lock (it does not spawn its engine), so it keeps no such record (${file})`
    )
  yield* sweepTemps(file)
  const text = yield* bounded(`reading ${file}`, () =>
    readNoFollow(file, MAX_RECORD_BYTES).catch((e: NodeJS.ErrnoException) => {
      if (e.code === "ENOENT") return undefined
      throw e
    })
  ).pipe(
    Effect.catch((reason) =>
      Effect.as(Effect.logWarning(`etcd: cannot read the lease record ${file}: ${reason}`), null)
    )
  )
  const previous = typeof text === "string" ? decodeLeaseRecord(text) : undefined
  if (typeof text === "string" && previous === undefined)
    yield* Effect.logWarning(`etcd: ${file} holds no lease record; not used`)
  const notRevoked =
    previous === undefined ? `${file} records none` : `${file} records lease ${epochOf(previous)}, not this one`
  return {
    previous,
    write: (leaseId) =>
      bounded(`writing ${file}`, () =>
        writeDurably(file, `${JSON.stringify({ lease: leaseId, epoch: epochOf(leaseId), key })}\n`)
      ).pipe(
        Effect.flatMap((warning) => (warning === undefined ? Effect.void : Effect.logWarning(`etcd: ${warning}`))),
        Effect.catch((reason) =>
          Effect.logWarning(
            `etcd: cannot record lease ${epochOf(leaseId)} in ${file} (${reason}): should this agent die without revoking it, the next one waits for it to end`
          )
        )
      ),
    // Not synced, and bounded tighter than the rest: it runs in the shutdown, after the revoke (programs/shutdownBound.ts
    // counts both). A record that outlives its removal names a revoked lease, which holds no key again.
    remove: bounded(`removing ${file}`, () => fsp.rm(file, { force: true }), REMOVE_BOUND_MS).pipe(
      Effect.catch((reason) => Effect.logWarning(`etcd: cannot remove the lease record ${file}: ${reason}`))
    ),
    notRevoked
  } satisfies LeaseRecord
})
