/**
 * One TCP connection attempt, closed at once, and what came of it: for the checks that ask a port or the host's
 * sockets a question (is something listening; can the host give the agent a socket at all) without sending a byte.
 */
import * as net from "node:net"
import { Effect, Option } from "effect"
import { isWildcardHost } from "../../services/net/HostPort.ts"

export type ConnectOutcome =
  /** The connection was made. */
  | { readonly _tag: "Connected" }
  /**
   * It failed with `code` (ECONNREFUSED, EMFILE, ENOTFOUND...); `resolved`: the host's name had been looked up (or
   * needed none), so the error is the connection's and not the lookup's.
   */
  | { readonly _tag: "Failed"; readonly code: string | undefined; readonly resolved: boolean }
  /** Neither within the bound; `resolved` as above. */
  | { readonly _tag: "Pending"; readonly resolved: boolean }

/** Connects to host:port and closes the socket at once, whatever came of it within `timeoutMs`. */
export const connectOnce = (host: string, port: number, timeoutMs: number): Effect.Effect<ConnectOutcome> => {
  // an address needs no lookup; for a name the socket says when it has one ('lookup')
  let resolved = net.isIP(host) !== 0
  return Effect.callback<ConnectOutcome>((resume) => {
    let socket: net.Socket
    try {
      socket = net.connect({ host, port })
    } catch (e) {
      resume(Effect.succeed({ _tag: "Failed", code: (e as NodeJS.ErrnoException).code, resolved }))
      return
    }
    socket.once("lookup", (err: Error | null) => {
      if (err === null) resolved = true
    })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed({ _tag: "Connected" }))
    })
    socket.once("error", (e: NodeJS.ErrnoException) => {
      socket.destroy()
      resume(Effect.succeed({ _tag: "Failed", code: e.code, resolved }))
    })
    // on interruption (the timeout) only: a settled attempt has closed its socket already
    return Effect.sync(() => socket.destroy())
  }).pipe(
    Effect.timeoutOption(timeoutMs),
    Effect.map(Option.getOrElse((): ConnectOutcome => ({ _tag: "Pending", resolved })))
  )
}

/** Whether something accepts TCP connections on host:port (wildcard hosts are checked on loopback). */
export const portInUse = (host: string, port: number, timeoutMs = 1_000): Effect.Effect<boolean> => {
  const target = !isWildcardHost(host) ? host : host.includes(":") ? "::1" : "127.0.0.1"
  return Effect.map(connectOnce(target, port, timeoutMs), (o) => o._tag === "Connected")
}
