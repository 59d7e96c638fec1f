/**
 * What `cgn-agent generate` says of a gRPC failure's details: grpc-js's words shortened, and a TLS mismatch between
 * the flags and the agent said in the operator's terms instead of OpenSSL's. The mismatches are told by OpenSSL's
 * reason strings (openssl/openssl crypto/err/openssl.txt, SSL_R_*), not by the whole text, whose error codes,
 * source paths and line numbers change with every Node and OpenSSL release.
 */

/** Which TLS flags the call was made with. */
export interface TlsFlags {
  /** `--ca`: the channel speaks TLS. */
  readonly ca: boolean
  /** `--cert` and `--key`: a client certificate is offered. */
  readonly cert: boolean
}

/**
 * grpc-js's UNAVAILABLE details, shortened: "No connection established. Last error: Error: connect
 * ECONNREFUSED 127.0.0.1:1. Resolution note: " says no more than "cannot connect: connect ECONNREFUSED ...". The
 * time grpc-js appends to a failed connection's error (" (2026-01-02T03:04:05.678Z)", @grpc/grpc-js src/transport.ts
 * `connect`) is dropped too: the failure is now.
 */
export const shortDetails = (details: string): string =>
  details
    .replace(/\s*Resolution note:.*$/s, "")
    .replace(/^No connection established\. Last error: (Error: )?/, "cannot connect: ")
    .replace(/\s*\(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\)\.?\s*$/, "")
    .replace(/\.$/, "")

/**
 * A connection the flags and the agent disagree about, in the operator's words; undefined when the details show none.
 * `--ca` against a plaintext agent: OpenSSL reads the agent's HTTP/2 frames as a TLS record, "wrong version number"
 * (SSL_R_WRONG_VERSION_NUMBER). No `--ca` against an mTLS agent: the agent's TLS stack reads the HTTP/2 preface as a
 * broken TLS record and closes the connection, before any HTTP/2 frame: grpc-js's bare "Failed to connect" (its
 * message when the session closed with no error and no settings). `--ca` without `--cert` against an agent that
 * requires one: the agent's TLS alert "certificate required" (SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED).
 */
export const tlsMismatch = (details: string, addr: string, flags: TlsFlags): string | undefined => {
  if (flags.ca && /\bwrong version number\b/.test(details))
    return `the agent at ${addr} answered without TLS (plaintext gRPC: its security.require_mtls is off): drop --ca, --cert and --key`
  if (!flags.ca && /^No connection established\. Last error: (Error: )?Failed to connect\b/.test(details))
    return (
      `${addr} closed the connection before any gRPC answer: an agent with security.require_mtls on speaks only ` +
      "TLS; give --ca, --cert and --key"
    )
  if (flags.ca && !flags.cert && /\balert certificate required\b/.test(details))
    return `the agent at ${addr} requires a client certificate (security.require_mtls): give --cert and --key`
  return undefined
}

/** The failure's message after its status: a TLS mismatch said so, else grpc-js's details shortened. */
export const failureDetails = (details: string, addr: string, flags: TlsFlags): string => {
  const mismatch = tlsMismatch(details, addr, flags)
  return mismatch === undefined ? shortDetails(details) : `cannot connect: ${mismatch}`
}
