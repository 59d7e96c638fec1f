/**
 * Tls: the gRPC server's transport security from `[security]`. With `require_mtls`, TLS whose client
 * certificates must chain to `ca_file`; otherwise plaintext. The certificate files are re-read on change
 * (file and directory watches, so Kubernetes' symlink swap is seen) and on SIGHUP, and new connections get
 * the new certificate without a restart; `allowed_client_names` narrows the clients to some of the CA's
 * (ClientNames.ts). Owns the interface and the one error; the live code is layers/tls/Tls.ts.
 */
import { Context, type Effect, Schema } from "effect"
import type { ClientNotAllowed, PeerCertificateNames } from "./ClientNames.ts"

/** A certificate file that cannot be used. `key` is the config key (`security.cert_file`) or CLI flag. */
export class TlsError extends Schema.TaggedError<TlsError>()("TlsError", {
  key: Schema.String,
  path: Schema.optionalKey(Schema.String),
  reason: Schema.String
}) {
  override get message(): string {
    return `${this.key}${this.path === undefined ? "" : ` (${this.path})`}: ${this.reason}`
  }
}

/** PEM contents of one identity and its trust anchor. */
export interface TlsMaterial {
  readonly ca: Buffer
  readonly cert: Buffer
  readonly key: Buffer
}

/**
 * `security.allowed_client_names` as the server asks it: once per connection, when its TLS handshake completes,
 * with the client's certificate and address. A refusal (reported by the check: logged, counted) ends every call on
 * the connection with it.
 */
export interface ClientNameCheck {
  readonly admit: (certificate: PeerCertificateNames, peer: string) => ClientNotAllowed | undefined
}

/** Certificates that can change while a server runs: the current ones and each update after. */
export interface TlsSource {
  readonly current: () => TlsMaterial
  /** Calls `listener` with each new material; the function it returns unsubscribes. */
  readonly subscribe: (listener: (material: TlsMaterial) => void) => () => void
  /** Which clients of the CA may call; absent: any certificate that chains to `ca_file`. */
  readonly clientNames?: ClientNameCheck | undefined
}

/** What /status and the metrics show of the served certificates. */
export interface TlsStatus {
  /** True when the server requires mTLS. */
  readonly enabled: boolean
  /** How many times material was applied (1 after start with mTLS, 0 in plaintext). */
  readonly generation: number
  /** The served certificate's end of validity (ISO 8601); absent in plaintext. */
  readonly certificateNotAfter?: string
  /** Why the last reload failed, while the previous certificates are still served (retried with backoff). */
  readonly reloadError?: string
  /**
   * Connections whose client certificate `security.allowed_client_names` refused, since start; absent without the
   * list (any certificate of the CA is allowed).
   */
  readonly clientsRefused?: number
}

export interface TlsService {
  /** True when the server requires mTLS; false: plaintext. */
  readonly enabled: boolean
  /** For the gRPC server (GrpcServer `tls`): follows reloads for the life of the server; undefined in plaintext. */
  readonly serverTls: TlsSource | undefined
  /**
   * Re-read the files now. True when the material changed and was applied; fails (keeping the old) if invalid,
   * and the files are then read again with backoff until they are valid. One reload runs at a time.
   */
  readonly reload: Effect.Effect<boolean, TlsError>
  /**
   * What SIGHUP does (layers/tls/Tls.ts hangupReload): `reload`, its outcome logged, never failing. A problem already
   * warned of (by a file event's reload or a retry) is not warned of again: one cause, one warning. Its result: the
   * problem the files have, said (undefined when they are fine), for the SIGHUP's other lines not to repeat it.
   */
  readonly hangup: Effect.Effect<string | undefined>
  /** How many times material was applied (1 after start with mTLS, 0 in plaintext). */
  readonly generation: Effect.Effect<number>
  /** The last reload failure, cleared by a successful reload. */
  readonly lastError: Effect.Effect<TlsError | undefined>
  /** The above and the served certificate's expiry, for /status and the metrics. */
  readonly status: Effect.Effect<TlsStatus>
}

export class Tls extends Context.Service<Tls, TlsService>()("cgn-agent/Tls") {}
