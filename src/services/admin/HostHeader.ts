/**
 * The admin server's Host-header rule against DNS rebinding (pure). A web page on `evil.example` can have its
 * own name resolve to 127.0.0.1 once loaded; its scripts then reach a loopback-only admin port as that page's
 * own origin, so the browser lets them read `GET /status` and `/metrics` (the Origin/Sec-Fetch-Site check covers
 * the POSTs, and old browsers send neither on a GET). What such a request cannot hide is its Host header: the
 * attacker's name. So while the admin server listens on loopback, only a Host naming loopback is served.
 * See https://en.wikipedia.org/wiki/DNS_rebinding and the same rule in Kubernetes' kubectl proxy
 * (staging/src/k8s.io/kubectl/pkg/proxy/proxy_server.go, `DefaultHostAcceptRE`).
 */
import { isLoopbackHost } from "../net/HostPort.ts"

/**
 * A Host header's host part, as RFC 9110 §7.2 writes it (`uri-host [ ":" port ]`: a name, an IPv4 address or a
 * bracketed IPv6 one), or undefined for anything else (userinfo, a path, spaces), which no client writes.
 */
const hostOf = (header: string): string | undefined => {
  const m = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::\d{0,5})?$/.exec(header.trim())
  return m?.[1]
}

/**
 * Whether a request with this Host header may be served by an admin server bound on loopback: the host names
 * loopback (`localhost` in any case, with or without its root dot, 127.0.0.0/8 in any spelling, `[::1]`,
 * `[::ffff:127.x.y.z]`), with any port (an SSH tunnel or `kubectl port-forward` names its own). The bound
 * address is always one of those (a loopback bind is the only case this rule applies to). An absent Host is
 * allowed: HTTP/1.1 requires it (Node answers its absence 400 itself) and every browser sends one, so only an
 * HTTP/1.0 tool on the host can omit it.
 */
export const hostAllowedOnLoopback = (header: string | undefined): boolean => {
  if (header === undefined) return true
  const host = hostOf(header)
  return host !== undefined && isLoopbackHost(host)
}

/** The plain reason a refused Host is answered with. */
export const misdirectedReason = (header: string): string =>
  `refused: Host ${JSON.stringify(header)} is not a loopback name or address, and this admin port listens on ` +
  "loopback only (a DNS-rebinding guard); use http://127.0.0.1:<port> or http://localhost:<port>"
