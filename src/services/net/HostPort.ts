/**
 * Host and port as the config writes them (`host:port`, an IPv6 host in brackets), split, joined and judged
 * (pure). Every listen and advertise key goes through here: config checks, the gRPC and admin servers, the engine
 * backends and the advertised address.
 */

const WILDCARDS = new Set(["0.0.0.0", "::", "[::]", ""])

/** Splits `host:port` (IPv6 in brackets) into its parts. */
export const splitHostPort = (hostPort: string): { readonly host: string; readonly port: string } => {
  const i = hostPort.lastIndexOf(":")
  if (i < 0) return { host: hostPort, port: "" }
  return { host: hostPort.slice(0, i), port: hostPort.slice(i + 1) }
}

/** Whether a host (IPv6 bracketed or not) is a wildcard: every address of this machine, none to dial. */
export const isWildcardHost = (host: string): boolean => WILDCARDS.has(canonicalHost(host))

/**
 * A host as the URL parser writes it, so that equal addresses compare equal: names lowercased, IPv4 in dotted
 * form ("127.1" gives "127.0.0.1"), IPv6 bracketed and compressed ("[0:0::0]" gives "[::]").
 */
export const canonicalHost = (host: string): string => {
  try {
    return new URL(`http://${host}/`).hostname
  } catch {
    return host.toLowerCase()
  }
}

/** `host:port`, bracketing a bare IPv6 host. */
export const joinHostPort = (host: string, port: string | number): string =>
  host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`

/** A host without its IPv6 brackets (`[::1]` gives `::1`). */
export const unbracket = (host: string): string =>
  host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host

/** 127.0.0.0/8, ::1, ::ffff:127.x and `localhost` are loopback; wildcards and everything else are not. */
export const isLoopbackHost = (host: string): boolean => {
  const h = unbracket(host).toLowerCase()
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true
  const v4 = h.startsWith("::ffff:") ? h.slice(7) : h
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4)
}

/** The host part of `host:port`, without brackets (`[::1]:7071` gives `::1`). */
export const hostOfAddr = (addr: string): string => unbracket(splitHostPort(addr).host)
