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

/**
 * The address a host names, for comparing listeners (pure, no DNS): canonicalHost of it (a bare IPv6 host
 * bracketed first), an IPv4-mapped IPv6 address as its IPv4 one ("[::ffff:127.0.0.1]" gives "127.0.0.1": a socket
 * bound to either takes the other's port), a name without the root's dot ("localhost." gives "localhost").
 */
export const canonicalAddress = (host: string): string => {
  const bare = unbracket(host)
  // a colon is no name's: a bare host with one is an IPv6 address
  const c = canonicalHost(bare.includes(":") ? `[${bare}]` : bare)
  const mapped = /^\[::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/.exec(c)
  if (mapped !== null) {
    const [hi, lo] = [Number.parseInt(mapped[1]!, 16), Number.parseInt(mapped[2]!, 16)]
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`
  }
  // the URL parser already drops an IPv4 address's trailing dot: one left ends a name
  return c.endsWith(".") ? c.slice(0, -1) : c
}

/**
 * The addresses a listener on `host` may take, canonical: `localhost` is whichever of 127.0.0.1 and ::1 the
 * resolver gives first (Node binds the first address dns.lookup returns), so it may take either; any other host
 * is its one canonicalAddress.
 */
export const listenAddresses = (host: string): ReadonlyArray<string> => {
  const c = canonicalAddress(host)
  return c === "localhost" ? ["127.0.0.1", "[::1]"] : [c]
}

/** `host:port`, bracketing a bare IPv6 host. */
export const joinHostPort = (host: string, port: string | number): string =>
  host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`

/** A host without its IPv6 brackets (`[::1]` gives `::1`). */
export const unbracket = (host: string): string =>
  host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host

/**
 * 127.0.0.0/8, ::1, ::ffff:127.x and `localhost` are loopback in any spelling the resolver binds the same
 * (`127.1`, `localhost.`, `[0:0::1]`: canonicalAddress); wildcards and everything else are not.
 */
export const isLoopbackHost = (host: string): boolean =>
  listenAddresses(host).every((a) => a === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(a))

/** The host part of `host:port`, without brackets (`[::1]:7071` gives `::1`). */
export const hostOfAddr = (addr: string): string => unbracket(splitHostPort(addr).host)
