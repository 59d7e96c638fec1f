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

/**
 * Whether a failure is an error etcd sent (a refusal: RESOURCE_EXHAUSTED over its space quota, a permission), not a
 * call that got no answer (no connection, its deadline, cancelled). Given the loaded etcd3 module, whose classes the
 * errors are (loaded on use: a standalone agent never holds it).
 */
export const answeredBy =
  (etcd3: typeof import("etcd3")) =>
  (e: unknown): boolean =>
    (e instanceof etcd3.GRPCGenericError || e instanceof etcd3.EtcdError) &&
    !(
      e instanceof etcd3.GRPCDeadlineExceededError ||
      e instanceof etcd3.GRPCUnavailableError ||
      e instanceof etcd3.GRPCCancelledError
    )
