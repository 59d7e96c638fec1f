/**
 * The reference receiver's SocketServer: @effect/platform-node's NodeSocketServer, whose connections' writes end
 * (failing) once their socket has closed instead of waiting forever.
 *
 * Why: the upstream connection writer (github.com/Effect-TS/effect, 4.1.0:
 * packages/platform/node-shared/src/NodeSocket.ts, `fromDuplex`'s `write` and `awaitDrain`) calls
 * `conn.write(chunk)` and, when that returns false, waits for the socket's 'drain', 'error' or 'close'. A socket
 * already destroyed (its peer gone: the write before got EPIPE) returns false to every write and never emits any of
 * them again, so that write never ends. effect's RpcServer (packages/effect/src/rpc/RpcServer.ts, `handleRequest`
 * and `handleEncode`) writes a request's answer in the request fiber's `Effect.onExit`, which is uninterruptible,
 * and when that write fails, writes the failure as the request's Exit from there too: that second write, to the
 * destroyed socket, hung the request fiber for good. Shutting the server down interrupts its request fibers and
 * waits for them (`Fiber.runIn` on the server's scope), so the receiver's SIGTERM/SIGINT never finished and only
 * SIGKILL ended it. It took a peer that closed a connection with a request and a Ping still unanswered: what the
 * agent does on its ping timeout to a receiver that was paused (SIGSTOP) and resumed.
 *
 * A connection its peer dropped (reset, or closed with data unread) ends quietly, with one debug line: upstream logs
 * every connection handler's failure as "Unhandled error in SocketServer" with a stack trace, at error level
 * (packages/platform/node-shared/src/NodeSocketServer.ts, `makeNetServer`'s `run`: `Effect.ignoreCause({ log:
 * "Unhandled" })`), and effect's RpcServer turns a read error other than a close into a defect (packages/effect/src/
 * rpc/RpcServer.ts, `makeSocketProtocol`'s `onSocket`: `Effect.orDie`). An agent that gave up on a paused receiver
 * left one such trace per reconnect attempt. Any other failure still reaches upstream's log.
 *
 * Its Unix socket path is removed at the end only while it is still this receiver's: ownedSocketPath.ts.
 */
import type * as net from "node:net"
import * as NodeSocket from "@effect/platform-node/NodeSocket"
import { Cause, Effect, Layer, Option } from "effect"
import { Socket, SocketServer } from "effect/socket"
import * as OwnedSocketPath from "./ownedSocketPath.ts"

/** A write to a connection that can take no more: its peer is gone (code as Node's for a write after destroy). */
const closedError = (cause: unknown) => new Socket.SocketError({ reason: new Socket.SocketWriteError({ cause }) })
const socketClosed = () => Object.assign(new Error("socket closed"), { code: "ERR_SOCKET_CLOSED" })

/** Error codes of a read or write on a connection whose peer went away (reset it, or closed it unread). */
const PEER_GONE = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED", "ERR_STREAM_DESTROYED", "ERR_SOCKET_CLOSED"])

/** The error code behind a SocketError's read or write failure; undefined for anything else. */
const peerGoneCode = (error: unknown): string | undefined => {
  if (!Socket.isSocketError(error)) return undefined
  const reason = error.reason
  if (reason._tag !== "SocketReadError" && reason._tag !== "SocketWriteError") return undefined
  const code = (reason.cause as { readonly code?: unknown } | undefined)?.code
  return typeof code === "string" && PEER_GONE.has(code) ? code : undefined
}

/** The code when every failure and defect of `cause` (at least one) is the peer going away; else undefined. */
export const peerDropped = (cause: Cause.Cause<unknown>): string | undefined => {
  let code: string | undefined
  for (const reason of cause.reasons) {
    if (Cause.isInterruptReason(reason)) continue
    const c = peerGoneCode(Cause.isFailReason(reason) ? reason.error : reason.defect)
    if (c === undefined) return undefined
    code = c
  }
  return code
}

/**
 * Writes `chunk` to `conn` with the upstream writer's backpressure (wait for 'drain'), but fails at once on a socket
 * that can take no more (destroyed, errored or ended): no event would ever end that wait. The listeners go on in the
 * same tick as the write, before the socket's 'error'/'close' (emitted a tick after it is destroyed) can pass.
 */
const writeTo = (conn: net.Socket, chunk: Uint8Array | string) =>
  Effect.callback<void, Socket.SocketError>((resume) => {
    if (conn.destroyed || !conn.writable) {
      resume(Effect.fail(closedError(socketClosed())))
      return
    }
    let needsDrain: boolean
    try {
      needsDrain = !conn.write(chunk)
    } catch (cause) {
      resume(Effect.fail(closedError(cause)))
      return
    }
    if (!needsDrain) {
      resume(Effect.void)
      return
    }
    const cleanup = () => {
      conn.off("drain", onDrain)
      conn.off("error", onError)
      conn.off("close", onClose)
    }
    const onDrain = () => {
      cleanup()
      resume(Effect.void)
    }
    const onError = (cause: unknown) => {
      cleanup()
      resume(Effect.fail(closedError(cause)))
    }
    const onClose = () => {
      cleanup()
      resume(Effect.fail(closedError(socketClosed())))
    }
    conn.on("drain", onDrain)
    conn.on("error", onError)
    conn.on("close", onClose)
    return Effect.sync(cleanup)
  })

/** `socket` with its frames written by `writeTo`; close events and the writer's release stay upstream's. */
const guardWrites = (socket: Socket.Socket, conn: net.Socket): Socket.Socket =>
  Socket.make({
    reader: socket.reader,
    writer: Effect.map(socket.writer, (upstream) => ({
      write: (chunk) => (Socket.isCloseEvent(chunk) ? upstream.write(chunk) : writeTo(conn, chunk)),
      writeAll: (chunks) => Effect.forEach(chunks, (chunk) => writeTo(conn, chunk), { discard: true })
    }))
  })

/** A connection handler's end: quiet (one debug line) when its peer dropped it, else as it was for upstream to log. */
const quietPeerDrops = <A, E, R>(handled: Effect.Effect<A, E, R>): Effect.Effect<void, E, R> =>
  Effect.catchCause(Effect.asVoid(handled), (cause) => {
    const code = peerDropped(cause)
    return code === undefined
      ? Effect.failCause(cause)
      : Effect.logDebug("kvcached receiver: a peer dropped its connection", { code })
  })

/** The receiver's SocketServer on the Unix socket `path`: each connection's writes guarded (see the module comment). */
export const layer = (path: string, options: net.ServerOpts = {}) =>
  Layer.effect(SocketServer.SocketServer)(
    Effect.map(OwnedSocketPath.make(path, options), (server) =>
      SocketServer.SocketServer.of({
        address: server.address,
        run: (handler) =>
          server.run((socket) =>
            // NodeSocketServer runs each connection's handler with its net.Socket as NetSocket (packages/platform/
            // node-shared/src/NodeSocketServer.ts, `makeNetServer`'s `run`); without it, the socket as it is.
            Effect.flatMap(Effect.serviceOption(NodeSocket.NetSocket), (conn) =>
              quietPeerDrops(handler(Option.isSome(conn) ? guardWrites(socket, conn.value) : socket))
            )
          )
      })
    )
  )
