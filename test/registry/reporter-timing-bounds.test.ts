/**
 * The bounds of the HealthReporter's timing (services/registry/ReporterTiming.ts) that reporter-tables.test.ts's
 * table does not reach: each clamp on its own. etcd grants leases in whole seconds (etcd-io/etcd api/etcdserverpb
 * rpc.proto, LeaseGrantRequest.TTL "advisory time-to-live in seconds"), so a TTL is rounded up, never down to a lease
 * shorter than configured.
 */
import { Duration } from "effect"
import { describe, expect, it } from "vitest"
import { reporterTiming } from "../../src/services/registry/ReporterTiming.ts"

const timing = (heartbeatMs: number, ttlMs: number) =>
  reporterTiming(Duration.millis(heartbeatMs), Duration.millis(ttlMs))

describe("reporter timing bounds", () => {
  it("rounds a fractional lease TTL up to whole seconds, never down", () => {
    expect(timing(1000, 2200).ttlSeconds).toBe(3)
    expect(timing(1000, 1400).ttlSeconds).toBe(2)
  })

  it("grants at least a 1 s lease, even for a zero TTL", () => {
    expect(timing(1000, 0).ttlSeconds).toBe(1)
  })

  it("keeps the lease alive at most every 50 ms, however short the heartbeat", () => {
    expect(timing(20, 1000).tickMs).toBe(50)
  })

  it("lets one etcd call take at least 1 s (a busy host) and at most 5 s, within half the TTL", () => {
    // heartbeat 200 ms, TTL 3 s: 1 s, not the heartbeat
    expect(timing(200, 3000).callTimeoutMs).toBe(1000)
    // heartbeat 10 s, TTL 60 s: capped at 5 s
    expect(timing(10_000, 60_000).callTimeoutMs).toBe(5000)
  })
})
