/**
 * The live `security.allowed_client_names` check the gRPC server asks at each connection's handshake
 * (services/tls/ClientNames.ts decides): a refused connection is counted (TlsStatus.clientsRefused, mirrored to
 * `cgn_agent_tls_client_connections_refused_total`) and logged at warn, at most once per peer address and certificate
 * names a minute (services/observability/RateLimitedLog.ts; the others at debug, the count of those folded into the
 * next warning): a client that reconnects in a loop must not flood the log at the default level.
 */
import { Effect } from "effect"
import { RateLimitedLog } from "../../services/observability/RateLimitedLog.ts"
import { ALLOWED_CLIENT_NAMES, ClientNameAllowlist } from "../../services/tls/ClientNames.ts"
import type { ClientNameCheck } from "../../services/tls/Tls.ts"

export interface ClientNameChecking {
  readonly check: ClientNameCheck
  /** Connections refused so far. */
  readonly refused: () => number
}

/** A refusal's log line: at warn (`warn`) or debug. */
export type RefusalLog = (warn: boolean, line: string, fields: Readonly<Record<string, string | number>>) => void

/**
 * The log of the refusals as effects, run from the server's callback with `run` (Effect.runCallbackWith of the
 * layer's context, so the daemon's logger).
 */
export const effectLog =
  (run: (effect: Effect.Effect<void>) => unknown): RefusalLog =>
  (warn, line, fields) =>
    void run(warn ? Effect.logWarning(line, fields) : Effect.logDebug(line, fields))

/**
 * The check for a non-empty list; `now` is the clock of the rate limit (tests), monotonic as guardReport.ts's: a wall
 * clock stepped back would hold a window open. Called in the TLS handshake's callback, off Effect, like the guard.
 */
export const makeClientNameCheck = (
  names: ReadonlyArray<string>,
  log: RefusalLog,
  now: () => number = () => performance.now()
): ClientNameChecking => {
  const allowlist = new ClientNameAllowlist(names)
  const gate = new RateLimitedLog()
  let refused = 0
  const admit: ClientNameCheck["admit"] = (certificate, peer) => {
    const refusal = allowlist.admit(certificate)
    if (refusal === undefined) return undefined
    refused++
    // per address and certificate: a client reconnecting in a loop is one warning a window, a second wrong
    // certificate on the same host (another workload) its own
    const noted = gate.note(`${peer} ${refusal.names}`, now())
    const warn = noted !== undefined
    const quiet = noted?.suppressed ?? 0
    const line = `gRPC: client certificate not in ${ALLOWED_CLIENT_NAMES}; every call on the connection is refused PERMISSION_DENIED`
    const fields = { peer, names: refusal.names, ...(quiet > 0 ? { not_warned_since_last: quiet } : {}) }
    log(warn, line, fields)
    return refusal
  }
  return { check: { admit }, refused: () => refused }
}
