/**
 * The gRPC address this node advertises to the router (pure): `[agent].advertise_addr` if set, else the
 * `NODE_IP` env var (the Kubernetes downward API), else the listen host when it is a specific address,
 * else the host's first non-internal IPv4 address, always with the port of `[agent].listen_grpc`.
 * The caller passes `os.networkInterfaces()` in, so this module does no I/O and is tested with tables: as a function
 * where listing them may fail (advertiseAddrOf), called only when the listen host is a wildcard. Listing them opens a
 * socket: a host with no descriptor left fails there, and a specific listen host has no need of them.
 */
import { Data, Effect } from "effect"
import { isWildcardHost, joinHostPort, splitHostPort } from "../net/HostPort.ts"
import { descriptorAdvice, descriptorShortage } from "../node/HostShortage.ts"

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
  /** The interfaces, or how to list them: called only when nothing else decides the host. */
  readonly interfaces: Interfaces | (() => Interfaces)
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
  const interfaces = typeof input.interfaces === "function" ? input.interfaces() : input.interfaces
  return joinHostPort(firstExternalIpv4(interfaces) ?? "127.0.0.1", port)
}

/** The host's interfaces could not be listed for the advertised address (`run` ends on it: exit 1). */
export class AdvertiseError extends Data.TaggedError("AdvertiseError")<{ readonly message: string }> {}

/**
 * resolveAdvertiseAddr with the interfaces listed by `list` (`os.networkInterfaces`) only when they decide the
 * address; a failure to list them is an AdvertiseError naming the key and the cause, not a defect.
 */
export const advertiseAddrOf = (
  input: Omit<AdvertiseInput, "interfaces">,
  list: () => Interfaces
): Effect.Effect<string, AdvertiseError> =>
  Effect.try({
    try: () => resolveAdvertiseAddr({ ...input, interfaces: list }),
    catch: (e) => {
      const shortage = descriptorShortage(e)
      const cause = shortage !== undefined ? descriptorAdvice(shortage) : e instanceof Error ? e.message : String(e)
      return new AdvertiseError({
        message: `agent.listen_grpc: cannot list this host's network interfaces for the address to advertise (listen host ${splitHostPort(input.listenGrpc).host} is a wildcard; agent.advertise_addr or NODE_IP would decide it instead): ${cause}`
      })
    }
  })
