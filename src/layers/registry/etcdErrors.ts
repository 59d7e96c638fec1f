/**
 * What an etcd call's failure says: its text (with the [cluster] setting to check when TLS failed), and whether
 * etcd answered it with a refusal or it got no answer at all.
 */

export const reasonOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/**
 * grpc-js buries TLS failures in "14 UNAVAILABLE: No connection established. Last error: <openssl text>";
 * say which [cluster] setting to look at, since that is all an operator can change.
 */
const REFUSED_BY_SERVER = /alert (bad certificate|certificate required|unknown ca|handshake failure)/i
const SERVER_UNTRUSTED =
  /unable to verify|self[- ]signed|unable to get (local )?issuer|certificate has expired|ERR_TLS_CERT_ALTNAME_INVALID/i

export const withTlsHint = (reason: string): string => {
  const text = reason
    .replace(/\s*Resolution note:\s*$/, "")
    .replace(/\s+/g, " ")
    .trim()
  if (REFUSED_BY_SERVER.test(text))
    return `TLS handshake refused by etcd: it requires a client certificate signed by a CA it trusts (check cluster.etcd_cert_file and etcd_key_file) [${text}]`
  if (SERVER_UNTRUSTED.test(text))
    return `etcd's server certificate is not trusted (check cluster.etcd_ca_file and that the certificate names the endpoint's host) [${text}]`
  return text
}

/** etcd's auth refusals, with the [cluster] setting to look at, as TLS failures get theirs. */
export const withAuthHint = (reason: string): string =>
  /authentication failed, invalid user ID or password/.test(reason)
    ? `${reason} (check cluster.etcd_username and etcd_password)`
    : /etcdserver: permission denied/.test(reason)
      ? `${reason} (the etcd user's roles must grant readwrite on cluster.etcd_prefix's keys)`
      : reason

/**
 * `withTlsHint` over a series of failures: grpc-js says why a connection failed once, and the calls that fail
 * on it while it stays down read "No connection established. Last error: null.": the TLS cause found before is
 * kept for those (a /status sampled once showed no cause every other time), until a failure says something else.
 */
export const makeFailureReasons = (): ((e: unknown) => string) => {
  let cause: string | undefined
  return (e) => {
    const text = withAuthHint(withTlsHint(reasonOf(e)))
    if (/Last error: null/.test(text) && cause !== undefined) return `${cause} (the connection is still down)`
    cause = text.startsWith("TLS handshake refused") || text.startsWith("etcd's server certificate") ? text : undefined
    return text
  }
}

/**
 * Whether a failure is an error etcd sent (a refusal: RESOURCE_EXHAUSTED over its space quota, a permission), not a
 * call that got no answer (no connection, its deadline, cancelled). Given the loaded etcd3 module, whose classes the
 * errors are (loaded on use: a standalone agent never holds it).
 */
export const answeredBy = (etcd3: typeof import("etcd3")) => {
  // etcd3 gives etcd's auth and lease refusals classes of their own, outside its two base classes
  // (etcd3 lib/errors.js, castGrpcError's table): a role's permission revoked is an answer as much as a full quota.
  const refusals = [
    etcd3.EtcdError,
    etcd3.EtcdPermissionDeniedError,
    etcd3.EtcdAuthenticationFailedError,
    etcd3.EtcdInvalidAuthTokenError,
    etcd3.EtcdUserNotFoundError,
    etcd3.EtcdRoleNotGrantedError,
    etcd3.EtcdRoleNotFoundError,
    etcd3.EtcdLeaseInvalidError
  ]
  return (e: unknown): boolean =>
    refusals.some((c) => e instanceof c) ||
    (e instanceof etcd3.GRPCGenericError &&
      !(
        e instanceof etcd3.GRPCDeadlineExceededError ||
        e instanceof etcd3.GRPCUnavailableError ||
        e instanceof etcd3.GRPCCancelledError
      ))
}

/**
 * What etcd's refusal says of its auth, for a client given a user: "off" when etcd has auth disabled (every call
 * that carries credentials is refused: etcd3 asks for a token first, which etcd refuses with "authentication is
 * not enabled"; Go's clientv3 then goes on without a token, client.go dial), "on" when a call without a token is
 * refused because auth is on again ("user name is empty"). Undefined otherwise.
 */
export const etcdAuthSays = (reason: string): "off" | "on" | undefined =>
  /authentication is not enabled/.test(reason) ? "off" : /user name is empty/.test(reason) ? "on" : undefined
