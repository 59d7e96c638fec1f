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
 */
import type * as net from "node:net"
import * as NodeSocket from "@effect/platform-node/NodeSocket"
import * as NodeSocketServer from "@effect/platform-node/NodeSocketServer"
import { Effect, Layer, Option } from "effect"
import { Socket, SocketServer } from "effect/socket"

const closedError = (cause: unknown) => new Socket.SocketError({ reason: new Socket.SocketWriteError({ cause }) })

/**
 * Writes `chunk` to `conn` with the upstream writer's backpressure (wait for 'drain'), but fails at once on a socket
 * that can take no more (destroyed, errored or ended): no event would ever end that wait. The listeners go on in the
 * same tick as the write, before the socket's 'error'/'close' (emitted a tick after it is destroyed) can pass.
 */
const writeTo = (conn: net.Socket, chunk: Uint8Array | string) =>
  Effect.callback<void, Socket.SocketError>((resume) => {
    if (conn.destroyed || !conn.writable) {
      resume(Effect.fail(closedError(new Error("socket closed"))))
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
      resume(Effect.fail(closedError(new Error("socket closed"))))
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

/** NodeSocketServer.layer on `options`, each connection's writes guarded (see the module comment). */
export const layer = (options: net.ServerOpts & net.ListenOptions) =>
  Layer.effect(SocketServer.SocketServer)(
    Effect.map(NodeSocketServer.make(options), (server) =>
      SocketServer.SocketServer.of({
        address: server.address,
        run: (handler) =>
          server.run((socket) =>
            // NodeSocketServer runs each connection's handler with its net.Socket as NetSocket (packages/platform/
            // node-shared/src/NodeSocketServer.ts, `makeNetServer`'s `run`); without it, the socket as it is.
            Effect.flatMap(Effect.serviceOption(NodeSocket.NetSocket), (conn) =>
              handler(Option.isSome(conn) ? guardWrites(socket, conn.value) : socket)
            )
          )
      })
    )
  )
