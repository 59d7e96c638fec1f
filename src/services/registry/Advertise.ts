/**
 * The gRPC address this node advertises to the router (pure): `[agent].advertise_addr` if set, else the
 * `NODE_IP` env var (the Kubernetes downward API), else the listen host when it is a specific address,
 * else the host's first non-internal IPv4 address, always with the port of `[agent].listen_grpc`.
 * The caller passes `os.networkInterfaces()` in, so this module does no I/O and is tested with tables.
 */
import { isWildcardHost, joinHostPort, splitHostPort } from "../net/HostPort.ts"

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
  if (!isWildcardHost(listen.host)) return joinHostPort(listen.host, port)
  return joinHostPort(firstExternalIpv4(input.interfaces) ?? "127.0.0.1", port)
}
