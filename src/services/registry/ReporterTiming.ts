/**
 * The HealthReporter's timing, derived from [agent] (pure): lease TTL in whole seconds, how often the
 * lease is kept alive, the deadline of one etcd call, and the retry delay after failures.
 */
import { Duration } from "effect"
import { jitteredBackoffMs } from "../retry/Backoff.ts"

/** Timing derived from [agent]; exported for tests and docs. */
export const reporterTiming = (heartbeat: Duration.Duration, leaseTtl: Duration.Duration) => {
  const heartbeatMs = Duration.toMillis(heartbeat)
  // etcd leases have whole-second TTLs, at least 1 s.
  const ttlSeconds = Math.max(1, Math.ceil(Duration.toMillis(leaseTtl) / 1000))
  // Keepalive at least three times per TTL (what the Go client does), writes once per heartbeat.
  const tickMs = Math.max(50, Math.min(heartbeatMs, Math.floor((ttlSeconds * 1000) / 3)))
  // A call may take up to a heartbeat (at least 1 s on a busy host), never more than half the TTL.
  const callTimeoutMs = Math.max(200, Math.min(Math.max(heartbeatMs, 1000), 5000, (ttlSeconds * 1000) / 2))
  return { heartbeatMs, ttlSeconds, tickMs, callTimeoutMs }
}

export type ReporterTiming = ReturnType<typeof reporterTiming>

/** Retry delay after `failures` consecutive failures, capped at one heartbeat (the shared jittered backoff). */
export const backoffMs = (failures: number, heartbeatMs: number, random: number): number =>
  jitteredBackoffMs(failures, heartbeatMs, random)

/**
 * Delay before re-registering after the lease was lost `lossesInRow` times with no write in between. The first
 * loss (expired after a pause, revoked from outside) is re-granted at once; a lease lost again before a write
 * under it (endpoints of two different clusters, a member that forgets leases) backs off like a failure, so the
 * reporter does not grant lease after lease in a tight loop.
 */
export const afterLeaseLossMs = (lossesInRow: number, heartbeatMs: number, random: number): number =>
  lossesInRow <= 1 ? 0 : backoffMs(lossesInRow - 1, heartbeatMs, random)
