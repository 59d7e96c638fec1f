/**
 * The reporter's etcd3 fault-handling policies (etcd3 IOptions.faultHandling). etcd3's own retry and circuit
 * breaker are replaced: the reporter owns backoff, and a 5 s open breaker would delay re-registration past one
 * heartbeat. `global` runs each call once, as is; per host, the endpoint failover below.
 *
 * Endpoint failover: etcd3 runs each call on one host of a shuffled cycle and, once a host's policy lets the
 * call through, never tries another host for it; a policy that refuses without calling makes it move on to the
 * next host. So with
 * several `[cluster].etcd` endpoints and one of them dead (down, partitioned, frozen), every other call went
 * to the dead one and failed, often enough to lose the lease (a node flapping in and out of etcd while a
 * healthy member was listed). This policy refuses a host whose last call failed on the connection
 * (unreachable, deadline) as long as some other host has not failed so; when every host has, all are tried
 * again, and the first call that a host answers (a unary call, or a keepalive stream's answer) clears it. No time is kept: only each host's last
 * outcome. Errors that are etcd's answer (lease not found, auth) say nothing about the host.
 */
import type { IOptions } from "etcd3"

export type Policy = NonNullable<NonNullable<IOptions["faultHandling"]>["global"]>

const noEvent = () => ({ dispose: () => undefined })
const never = new AbortController().signal

/** A policy that runs the call once, as is: no retry, no breaker. */
export const passThrough = (): Policy =>
  ({
    onSuccess: noEvent,
    onFailure: noEvent,
    execute: async <T>(fn: (ctx: { signal: AbortSignal }) => PromiseLike<T> | T, signal?: AbortSignal) =>
      fn({ signal: signal ?? never })
  }) as unknown as Policy

const isStream = (value: unknown): boolean =>
  typeof value === "object" && value !== null && typeof (value as { on?: unknown }).on === "function"

/** What a refused host throws; etcd3 only surfaces it if every host refused at once. */
export class EndpointSkipped extends Error {
  constructor(host: string) {
    super(`etcd endpoint ${host} skipped: its last call failed and another endpoint is available`)
  }
}

/**
 * One policy per host (etcd3's `faultHandling.host`), sharing which hosts failed last.
 * `isConnectionError` is etcd3's `isRecoverableError` (passed in: etcd3 is loaded lazily).
 */
export const makeHostFailover = (
  hosts: ReadonlyArray<string>,
  isConnectionError: (e: unknown) => boolean
): ((host: string) => Policy) => {
  const all = new Set(hosts)
  const failed = new Set<string>()
  return (host) =>
    ({
      onSuccess: noEvent,
      onFailure: noEvent,
      execute: async <T>(fn: (ctx: { signal: AbortSignal }) => PromiseLike<T> | T, signal?: AbortSignal) => {
        if (failed.has(host) && failed.size < all.size) throw new EndpointSkipped(host)
        try {
          const result = await fn({ signal: signal ?? never })
          // A unary call that answered clears the host; a stream (the keepalive) is only opened here, and clears
          // it once it answers: after a leader loss every member may have failed, and a host cleared by unary
          // calls alone kept drawing the dead member for rounds after the keepalives were answered again.
          if (!isStream(result)) failed.delete(host)
          else (result as unknown as NodeJS.EventEmitter).once("data", () => failed.delete(host))
          return result
        } catch (e) {
          if (typeof e === "object" && e !== null && isConnectionError(e)) failed.add(host)
          throw e
        }
      }
    }) as unknown as Policy
}
