/**
 * The gRPC address this node advertises to the router (pure): `[agent].advertise_addr` if set, else the
 * `NODE_IP` env var (the Kubernetes downward API), else the listen host when it is a specific address,
 * else the host's first non-internal IPv4 address, always with the port of `[agent].listen_grpc`.
 * The caller passes `os.networkInterfaces()` in, so this module does no I/O and is tested with tables.
 */

/** The shape of `os.networkInterfaces()` this needs. */
export type Interfaces = Readonly<
  Record<
    string,
    | ReadonlyArray<{ readonly address: string; readonly family: string | number; readonly internal: boolean }>
    | undefined
  >
>

export interface AdvertiseInput {
  readonly advertiseAddr: string | undefined
  readonly listenGrpc: string
  readonly nodeIp: string | undefined
  readonly interfaces: Interfaces
  /** The port the gRPC server actually bound, when listen_grpc asks for port 0. */
  readonly boundPort?: number | undefined
}

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

/** The first non-internal IPv4 address, in the order the interfaces are listed; undefined if none. */
export const firstExternalIpv4 = (interfaces: Interfaces): string | undefined => {
  for (const list of Object.values(interfaces)) {
    for (const a of list ?? []) {
      if ((a.family === "IPv4" || a.family === 4) && !a.internal) return a.address
    }
  }
  return undefined
}

/** Resolves the advertised `host:port`. Falls back to 127.0.0.1 on a host with no external IPv4. */
export const resolveAdvertiseAddr = (input: AdvertiseInput): string => {
  if (input.advertiseAddr !== undefined && input.advertiseAddr !== "") return input.advertiseAddr
  const listen = splitHostPort(input.listenGrpc)
  const port = listen.port === "0" && input.boundPort !== undefined ? String(input.boundPort) : listen.port
  const nodeIp = input.nodeIp?.trim()
  if (nodeIp !== undefined && nodeIp !== "") return joinHostPort(nodeIp, port)
  if (!WILDCARDS.has(listen.host)) return joinHostPort(listen.host, port)
  return joinHostPort(firstExternalIpv4(input.interfaces) ?? "127.0.0.1", port)
}
