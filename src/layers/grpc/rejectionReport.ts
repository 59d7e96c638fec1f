/**
 * Calls the gRPC server ended before their handler ran (http2/Server.ts onRejected: a request that broke the protocol
 * or did not decode, one too large or not arrived within agent.request_read_timeout, the arriving-bytes budget
 * spent, an unknown method) in the log: they are counted (Generate's in requests_total) but no handler ran to say
 * why, and a soak saw INTERNAL counted with nothing logged at any level. Logged at warn, at most once a minute per
 * method and reason (services/observability/RateLimitedLog.ts) with how many went unlogged since: a client that
 * breaks every call makes a line a minute. A caller's own cancel or deadline while its request arrived is a normal
 * end, not logged.
 */
import { Effect } from "effect"
import { endedByCaller, type GrpcFailure, statusName } from "../../services/grpc/GrpcStatus.ts"
import { RateLimitedLog } from "../../services/observability/RateLimitedLog.ts"

/** The reporter `onRejected` calls; `run` runs the log effect, `now` is a monotonic clock in ms. */
export const rejectionReport = (
  run: (effect: Effect.Effect<void>) => unknown,
  now: () => number = () => performance.now()
): ((path: string, f: GrpcFailure) => void) => {
  const log = new RateLimitedLog()
  return (path, f) => {
    if (endedByCaller(f)) return
    const reason = f.trailers["cgn-reason"] ?? statusName(f.code)
    const line = log.note(`${path} ${reason}`, now())
    if (line === undefined) return
    run(
      Effect.logWarning(`gRPC call refused before it ran: ${f.message}`, {
        method: path,
        code: statusName(f.code),
        reason,
        suppressed: line.suppressed
      })
    )
  }
}
