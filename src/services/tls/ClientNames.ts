/**
 * ClientNames: which client certificates `security.allowed_client_names` lets call the gRPC server (pure). With
 * mTLS, the handshake proves only that a certificate chains to `security.ca_file`; a CA shared with other workloads
 * would let every one of them call Generate. The list names the clients instead, matched against what the
 * certificate says it is: its subjectAltName entries (DNS names, URIs such as SPIFFE IDs, IP addresses) and, only
 * when it has none of those, its subject CN (RFC 6125 6.4.4: the CN is a legacy fallback, never looked at beside
 * a SAN; Node's tls.checkServerIdentity does the same, nodejs/node lib/tls.js).
 *
 * Matching is exact (DNS names case-insensitively, RFC 4343; IP addresses as addresses, so `fd00::1` is
 * `FD00:0:0:0:0:0:0:1`), with one wildcard: `*.router.cgn.svc` for exactly one DNS label (RFC 6125 6.4.3's form,
 * as cert-manager issues a Deployment's pods names under one domain). No other wildcards, and no URI prefixes: a
 * SPIFFE ID names one workload (spiffe://<trust domain>/ns/<namespace>/sa/<service account>), a prefix such as
 * `spiffe://cluster.local/ns/cgn` would also match `/ns/cgn-other/...` and readmit the neighbours this list keeps out;
 * routers are few, list each.
 */
import { Schema } from "effect"

/** The config key, as errors and logs name it. */
export const ALLOWED_CLIENT_NAMES = "security.allowed_client_names"

/** One entry of the list, by the form it is written in. */
export type ClientNamePattern =
  | { readonly kind: "dns"; readonly name: string }
  /** `*.<suffix>`: any one label, then `.<suffix>`. */
  | { readonly kind: "dnsWildcard"; readonly suffix: string }
  | { readonly kind: "uri"; readonly uri: string }
  | { readonly kind: "ip"; readonly ip: string }

/** What a client certificate names, as node:tls's getPeerCertificate() (or X509Certificate) gives it. */
export interface PeerCertificateNames {
  /** `DNS:a, URI:b, IP Address:c, ...`; absent without the extension. */
  readonly subjectaltname?: string | undefined
  /** Repeated attributes (two CNs) come as arrays. */
  readonly subject?: { readonly CN?: string | ReadonlyArray<string> | undefined } | null | undefined
}

/** The names the matching reads of one certificate. `cn`: only when the certificate has no DNS, URI or IP SAN. */
export interface CertificateIdentity {
  readonly dns: ReadonlyArray<string>
  readonly uri: ReadonlyArray<string>
  readonly ip: ReadonlyArray<string>
  readonly cn?: string
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/

/**
 * An IP address in one spelling, undefined for anything else: IPv4 in strict dotted-quad form (no leading zeros, as
 * node:net's isIP), IPv6 as the URL parser writes it (lowercased and compressed; the parser also checks it).
 */
const canonicalIp = (s: string): string | undefined => {
  if (IPV4.test(s)) return s
  if (!s.includes(":") || !URL.canParse(`http://[${s}]/`)) return undefined
  return new URL(`http://[${s}]/`).hostname.slice(1, -1)
}

/** Why `s` cannot be an entry of the list, or undefined when it can (the config's check). */
export const clientNameProblem = (s: string): string | undefined => {
  if (s === "") return "an empty name matches no certificate"
  if (/[\s,]/.test(s)) return `"${s}": a client name has no spaces or commas (one name per list entry)`
  if (s.includes("://")) {
    if (s.includes("*")) return `"${s}": URIs are matched exactly, without wildcards or prefixes; list each one`
    return URL.canParse(s) ? undefined : `"${s}": not a valid URI`
  }
  if (canonicalIp(s) !== undefined) return undefined
  const labels = s.split(".")
  if (labels.some((l) => l === "")) return `"${s}": a DNS name has no empty labels (leading, trailing or double dots)`
  if (labels.slice(1).some((l) => l.includes("*")) || (labels[0] !== "*" && labels[0]?.includes("*")))
    return `"${s}": a wildcard is a whole first label only, as in "*.router.cgn.svc" (one label)`
  if (labels[0] === "*" && labels.length < 3)
    return `"${s}": a wildcard needs at least two labels after it, as in "*.router.cgn.svc"`
  return undefined
}

/** Reads an entry (one clientNameProblem accepts). */
export const parseClientName = (s: string): ClientNamePattern => {
  if (s.includes("://")) return { kind: "uri", uri: s }
  const ip = canonicalIp(s)
  if (ip !== undefined) return { kind: "ip", ip }
  const name = s.toLowerCase()
  return name.startsWith("*.") ? { kind: "dnsWildcard", suffix: name.slice(1) } : { kind: "dns", name }
}

// A quoted SAN value, as JSON: Node quotes values holding a separator or a quote (CVE-2021-44532).
const JSON_STRING = /^"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/

/**
 * Splits Node's subjectaltname string into its entries; quoted values unquoted. As nodejs/node lib/tls.js
 * splitEscapedAltNames. undefined when the string is malformed (then nothing in it is trusted).
 */
export const splitAltNames = (altNames: string): Array<string> | undefined => {
  const result: Array<string> = []
  let token = ""
  let offset = 0
  while (offset !== altNames.length) {
    const nextSep = altNames.indexOf(", ", offset)
    const nextQuote = altNames.indexOf('"', offset)
    if (nextQuote !== -1 && (nextSep === -1 || nextQuote < nextSep)) {
      token += altNames.slice(offset, nextQuote)
      const quoted = JSON_STRING.exec(altNames.slice(nextQuote))
      if (quoted === null) return undefined
      token += JSON.parse(quoted[0]) as string
      offset = nextQuote + quoted[0].length
    } else if (nextSep !== -1) {
      result.push(token + altNames.slice(offset, nextSep))
      token = ""
      offset = nextSep + 2
    } else {
      token += altNames.slice(offset)
      offset = altNames.length
    }
  }
  result.push(token)
  return result
}

/** The DNS, URI and IP names of a certificate, and its CN when it has none of them (one CN only: two is ambiguous). */
export const certificateIdentity = (peer: PeerCertificateNames): CertificateIdentity => {
  const dns: Array<string> = []
  const uri: Array<string> = []
  const ip: Array<string> = []
  const entries = peer.subjectaltname === undefined ? [] : splitAltNames(peer.subjectaltname)
  // a SAN that does not parse: nothing of the certificate is trusted, its CN neither (RFC 6125 6.4.4 reads no CN
  // beside a SAN)
  if (entries === undefined) return { dns, uri, ip }
  for (const entry of entries) {
    if (entry.startsWith("DNS:")) dns.push(entry.slice(4))
    else if (entry.startsWith("URI:")) uri.push(entry.slice(4))
    else if (entry.startsWith("IP Address:")) ip.push(entry.slice(11))
  }
  const cn = peer.subject?.CN
  if (dns.length + uri.length + ip.length > 0 || typeof cn !== "string") return { dns, uri, ip }
  return { dns, uri, ip, cn }
}

/** The most names a refusal shows: a certificate may carry hundreds, and the message goes to the caller and the log. */
const SHOWN_NAMES = 8

/** The certificate's names as a log line and status message show them (`DNS:a, URI:b`, or `CN=x`). */
export const describeIdentity = (id: CertificateIdentity): string => {
  const names = [
    ...id.dns.map((n) => `DNS:${n}`),
    ...id.uri.map((n) => `URI:${n}`),
    ...id.ip.map((n) => `IP:${n}`),
    ...(id.cn === undefined ? [] : [`CN=${id.cn}`])
  ]
  if (names.length === 0) return "no DNS, URI or IP name and no single CN"
  const more = names.length - SHOWN_NAMES
  return more > 0 ? `${names.slice(0, SHOWN_NAMES).join(", ")} and ${more} more` : names.join(", ")
}

const dnsMatches = (p: ClientNamePattern, name: string): boolean => {
  const n = name.toLowerCase()
  if (p.kind === "dns") return n === p.name
  if (p.kind !== "dnsWildcard" || !n.endsWith(p.suffix)) return false
  // exactly one label before the suffix, itself no wildcard (a certificate's `*` is no client's name)
  const label = n.slice(0, -p.suffix.length)
  return label !== "" && !label.includes(".") && !label.includes("*")
}

/** Whether a pattern matches one of the certificate's names. */
export const patternMatches = (p: ClientNamePattern, id: CertificateIdentity): boolean => {
  switch (p.kind) {
    case "uri":
      return id.uri.includes(p.uri)
    case "ip":
      return id.ip.some((a) => canonicalIp(a) === p.ip)
    default:
      return id.dns.some((n) => dnsMatches(p, n)) || (id.cn !== undefined && dnsMatches(p, id.cn))
  }
}

/**
 * The connection's client certificate names none of `security.allowed_client_names`: it chains to the CA, but is
 * not one of the clients this agent serves. Every call on the connection ends PERMISSION_DENIED.
 */
export class ClientNotAllowed extends Schema.TaggedError<ClientNotAllowed>()("ClientNotAllowed", {
  names: Schema.String
}) {
  override get message(): string {
    return `the client certificate (${this.names}) is not allowed by ${ALLOWED_CLIENT_NAMES} on this agent`
  }
}

/**
 * The allowlist: `admit` answers undefined for an allowed certificate (any, for an empty list), else the refusal
 * naming the certificate's names.
 */
export class ClientNameAllowlist {
  readonly patterns: ReadonlyArray<ClientNamePattern>
  constructor(names: ReadonlyArray<string>) {
    this.patterns = names.map(parseClientName)
  }
  admit(peer: PeerCertificateNames): ClientNotAllowed | undefined {
    // an empty list is no list: any certificate of the CA, as without the key
    if (this.patterns.length === 0) return undefined
    const id = certificateIdentity(peer)
    return this.patterns.some((p) => patternMatches(p, id))
      ? undefined
      : new ClientNotAllowed({ names: describeIdentity(id) })
  }
}
