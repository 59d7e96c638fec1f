// Raw TCP clients of an HTTP/2 (h2c) server that stall, as a chaos soak's did: one that sends nothing, one that
// sends half the client preface, one that completes the handshake and then stops reading. Each stops reading
// once the server has it, so it never sees the server's FIN and never closes its side: only the server closing
// the socket itself ends the connection (a graceful close waits for the client forever).

import * as net from "node:net"

export type StalledKind = "nothing" | "half-preface" | "settled"

/** The client connection preface (RFC 9113 3.4): the magic, then a SETTINGS frame (empty here). */
const MAGIC = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
const EMPTY_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])
/** The server's SETTINGS ACK: length 0, type 4, flag ACK, stream 0. */
const SETTINGS_ACK = Buffer.from([0, 0, 0, 4, 1, 0, 0, 0, 0])

/**
 * Connects to `port` and stalls as `kind` says; resolves once the server has the connection (its SETTINGS came,
 * and for "settled" its ACK of the client's), with the socket then paused. Destroy it when done.
 */
export const stalledClient = (port: number, kind: StalledKind): Promise<net.Socket> =>
  new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1")
    socket.once("error", reject)
    if (kind === "half-preface") socket.write(MAGIC.slice(0, 16))
    if (kind === "settled") socket.write(Buffer.concat([Buffer.from(MAGIC), EMPTY_SETTINGS]))
    let got = Buffer.alloc(0)
    const onData = (d: Buffer) => {
      got = Buffer.concat([got, d])
      if (kind === "settled" && !got.includes(SETTINGS_ACK)) return
      socket.off("data", onData)
      socket.pause()
      socket.off("error", reject)
      socket.on("error", () => {})
      resolve(socket)
    }
    socket.on("data", onData)
  })
