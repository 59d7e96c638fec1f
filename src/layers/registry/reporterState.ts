/**
 * The HealthReporter's mutable state (the current lease session, counters, the last record written)
 * and the RegistrationStatus read from it. Only touched under the reporter's write lock, or read whole
 * by `status`.
 */
import type { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import type { ConflictHolder, RegistrationState, RegistrationStatus } from "../../services/registry/HealthReporter.ts"

/** One granted lease and what was done under it. */
export interface Session {
  readonly id: string
  readonly epoch: string
  readonly ttlMs: number
  readonly grantedAt: number
  lastKeepAliveAt: number
  registered: boolean
}

/** The reporter's mutable state; only touched under the write lock (or read whole by `status`). */
export interface ReporterState {
  state: RegistrationState
  session: Session | undefined
  sequence: number
  lastWriteMs: number | undefined
  lastRecord: NodeHealth | undefined
  forcedDraining: boolean
  /** The drain's own state=draining write failed or was cut short (etcd did not answer it); see shutdown. */
  drainWriteFailed: boolean
  stopping: boolean
  lastError: string | undefined
  conflict: ConflictHolder | undefined
  failuresInRow: number
  /** Leases lost since the last successful write (afterLeaseLossMs). */
  leaseLossesInRow: number
  writes: number
  writeFailures: number
  leasesGranted: number
  leasesLost: number
}

export const initialReporterState = (): ReporterState => ({
  state: "registering",
  session: undefined,
  sequence: 0,
  lastWriteMs: undefined,
  lastRecord: undefined,
  forcedDraining: false,
  drainWriteFailed: false,
  stopping: false,
  lastError: undefined,
  conflict: undefined,
  failuresInRow: 0,
  leaseLossesInRow: 0,
  writes: 0,
  writeFailures: 0,
  leasesGranted: 0,
  leasesLost: 0
})

/** The status `HealthReporter.status` reports, at time `now`. */
export const statusOf = (s: ReporterState, key: string, now: number): RegistrationStatus => {
  const session = s.session
  return {
    state: s.state,
    key,
    leaseId: session?.id,
    epoch: session?.epoch,
    leaseTtlMs: session?.ttlMs,
    leaseAgeMs: session === undefined ? undefined : now - session.grantedAt,
    sinceKeepAliveMs: session === undefined ? undefined : now - session.lastKeepAliveAt,
    sequence: s.lastRecord?.freshness?.sequence ?? 0,
    lastWriteAt: s.lastRecord?.freshness?.writtenAt,
    // What the node's key says now: nothing once its lease is gone (lost, revoked by a withdraw), though the last
    // record written stays in lastRecord for the next write's comparison and GetNodeHealth's freshness.
    publishedState: session?.registered === true ? s.lastRecord?.state : undefined,
    lastError: s.lastError,
    conflict: s.conflict,
    writes: s.writes,
    writeFailures: s.writeFailures,
    leasesGranted: s.leasesGranted,
    leasesLost: s.leasesLost
  }
}
