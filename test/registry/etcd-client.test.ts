/**
 * The reporter's etcd client (layers/registry/etcdClient.ts, makeEtcdOps) against a real etcd (test/support/etcd.ts):
 * what each operation answers at the edges registrationStep.ts relies on (a lease's TTL, a retried create, a write
 * on a lease etcd no longer has, a second revoke, a TLS reload with nothing changed).
 */
import { Effect, Exit, Result, Scope } from "effect"
// As the daemon's bundle does: nice-grpc bounds every grpc-js connection attempt in the process (health-reporter.test.ts).
import "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { type EtcdOps, makeEtcdOps } from "../../src/layers/registry/etcdClient.ts"
import { type EtcdHandle, startEtcd } from "../support/etcd.ts"

let etcd: EtcdHandle
let scope: Scope.Closeable
let ops: EtcdOps
beforeAll(async () => {
  etcd = await startEtcd()
  const decoded = decodeConfigObject(
    { cluster: { name: "c1", etcd: [etcd.endpoint] }, agent: { node_id: "n1" }, models: { m: { hf_repo: "org/m" } } },
    undefined,
    {}
  )
  if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
  scope = Effect.runSync(Scope.make())
  ops = await Effect.runPromise(
    Scope.provide(makeEtcdOps(decoded.success.cluster, { callTimeoutMs: 2_000, reconnectCapMs: 1_000 }), scope)
  )
}, 30_000)
afterAll(async () => {
  if (scope !== undefined) await Effect.runPromise(Scope.close(scope, Exit.void))
  await etcd?.dispose()
})

const run = <A, E>(effect: Effect.Effect<A, E>) => Effect.runPromise(effect)

describe("makeEtcdOps against a real etcd", () => {
  it("grant: the lease's TTL as etcd gave it, in milliseconds (the registration status shows it)", async () => {
    const lease = await run(ops.grant(7))
    expect(lease.ttlMs).toBe(7_000)
    await run(ops.revoke(lease.id))
  })

  it("create: a retried create whose first answer was lost finds the key ours and writes it, not 'held'", async () => {
    const lease = await run(ops.grant(5))
    expect(await run(ops.create("/t/retried", "v1", lease.id))).toEqual({ _tag: "Written" })
    expect(await run(ops.create("/t/retried", "v2", lease.id))).toEqual({ _tag: "Written" })
    await run(ops.revoke(lease.id))
  })

  // The auth retry (followingAuth) makes a call again only when etcd refused it for its auth: any other refusal is
  // the call's answer, sent once. Counted by etcd itself (its gRPC server's handled calls, grpc-prometheus).
  it("a call etcd refuses for anything but auth is made once: a revoke of a lease it does not have, one LeaseRevoke", async () => {
    const revokesRefused = async () => {
      const text = await (await fetch(`${etcd.endpoint}/metrics`)).text()
      const line = text
        .split("\n")
        .find(
          (l) =>
            l.startsWith("grpc_server_handled_total{") &&
            l.includes('grpc_method="LeaseRevoke"') &&
            l.includes('grpc_code="NotFound"')
        )
      return line === undefined ? 0 : Number(line.split(" ").at(-1))
    }
    const lease = await run(ops.grant(5))
    await run(ops.revoke(lease.id))
    const before = await revokesRefused()
    await run(ops.revoke(lease.id))
    expect(await revokesRefused()).toBe(before + 1)
  })

  it("a put under a lease etcd no longer has is LeaseLost naming that lease; a second revoke succeeds", async () => {
    const lease = await run(ops.grant(5))
    await run(ops.revoke(lease.id))
    // the key absent, its create's compare holds: the put itself meets the lease gone
    const lost = await run(Effect.flip(ops.create("/t/gone", "v", lease.id)))
    expect(lost).toMatchObject({ _tag: "LeaseLost", leaseId: lease.id })
    // already gone is what a revoke wants
    await expect(run(ops.revoke(lease.id))).resolves.toBeUndefined()
  })

  it("reloadTls with no [cluster] TLS files, nothing changed: false, the client kept", async () => {
    expect(await run(ops.reloadTls)).toBe(false)
  })
})
