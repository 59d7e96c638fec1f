/**
 * One etcd lease keepalive round trip: a LeaseKeepAlive stream opened with the call's deadline, one request, the
 * first answer (TTL 0: the lease expired or was revoked), the stream ended either way. The caller bounds it with its
 * own timeout too (etcdClient.ts), since a stream grpc-js never opens has no deadline of its own to fire.
 */
import { Effect } from "effect"
import type { LeaseClient } from "etcd3"
import { EtcdUnavailable, LeaseLost } from "../../services/registry/HealthReporter.ts"

export const keepAliveOnce = (
  leaseClient: LeaseClient,
  leaseId: string,
  callTimeoutMs: number,
  /** What a failure says (etcdErrors.ts makeFailureReasons). */
  reasonOf: (e: unknown) => string
): Effect.Effect<number, EtcdUnavailable | LeaseLost> =>
  Effect.callback<number, EtcdUnavailable | LeaseLost>((resume, signal) => {
    let done = false
    const finish = (e: Effect.Effect<number, EtcdUnavailable | LeaseLost>) => {
      if (done) return
      done = true
      resume(e)
    }
    leaseClient
      // a gRPC deadline is a wall-clock instant (grpc-js reads it against Date.now), not a span on Effect's Clock
      .leaseKeepAlive({ deadline: Date.now() + callTimeoutMs })
      .then((stream) => {
        const close = () => {
          try {
            stream.end()
          } catch {
            // already ended
          }
        }
        if (signal.aborted || done) return close()
        signal.addEventListener("abort", close, { once: true })
        stream.on("error", (e: unknown) => {
          finish(Effect.fail(new EtcdUnavailable({ operation: "lease keepalive", reason: reasonOf(e) })))
        })
        stream.on("data", (res: { TTL: string }) => {
          close()
          if (res.TTL === "0") {
            finish(Effect.fail(new LeaseLost({ leaseId, reason: "etcd reports the lease expired or revoked" })))
          } else {
            finish(Effect.succeed(Number(res.TTL) * 1000))
          }
        })
        stream.on("end", () =>
          finish(Effect.fail(new EtcdUnavailable({ operation: "lease keepalive", reason: "stream ended" })))
        )
        stream.write({ ID: leaseId })
      })
      .catch((e: unknown) =>
        finish(Effect.fail(new EtcdUnavailable({ operation: "lease keepalive", reason: reasonOf(e) })))
      )
  })
