/** A session's socket byte counters, read by the guard's flood rule (Guard.ts) and the keepalive (Keepalive.ts). */
import type * as http2 from "node:http2"

/** The socket's byte counters; undefined once node:http2 has let the socket go (the session is closing). */
export const counters = (session: http2.Http2Session): { read: number; written: number } | undefined => {
  try {
    const socket = session.socket
    return { read: socket.bytesRead, written: socket.bytesWritten }
  } catch {
    return undefined
  }
}
