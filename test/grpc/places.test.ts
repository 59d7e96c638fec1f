// The caps' places (layers/grpc/http2/Places.ts) over stand-in sockets, for what real sockets reach only by races:
// a socket accepted under the four addresses of one whose close has not come yet (its client reset it and connected
// again from the same port within one turn of the loop) owns its key, so its session settles it; the older one is
// still given back once, at its own close.

import { EventEmitter } from "node:events"
import type * as http2 from "node:http2"
import type * as net from "node:net"
import { describe, expect, it } from "vitest"
import type { GuardEvent } from "../../src/layers/grpc/http2/Guard.ts"
import { Places } from "../../src/layers/grpc/http2/Places.ts"

/** A stand-in for an accepted socket: its four addresses, `destroyed`, 'close'. */
class FakeSocket extends EventEmitter {
  readonly remoteAddress = "127.0.0.1"
  readonly remotePort = 40_001
  readonly localAddress = "127.0.0.1"
  readonly localPort = 7071
  destroyed = false
  destroy(): void {
    if (this.destroyed) return
    this.destroyed = true
    this.emit("close")
  }
}

const sessionOf = (socket: FakeSocket) =>
  ({ socket, destroyed: false, destroy: () => socket.destroy() }) as unknown as http2.Http2Session

describe("the caps' places", () => {
  it("a socket accepted under the key of one not yet closed owns the key; each is given back once", () => {
    const events: Array<GuardEvent> = []
    const places = new Places({ perPeer: 0, total: 0 }, true, (e) => events.push(e))
    const old = new FakeSocket()
    const renewed = new FakeSocket()
    expect(places.accept(old as unknown as net.Socket)).toBe(true)
    // The old one is dead (reset), its 'close' not yet emitted, when the new one is accepted.
    expect(places.accept(renewed as unknown as net.Socket)).toBe(true)
    const place = places.settle(sessionOf(renewed))
    expect(place?.socket).toBe(renewed)
    expect(place?.handshakeSinceMs).toBeUndefined()
    expect(places.open).toBe(2)
    old.destroy()
    expect(places.open).toBe(1)
    // The new one's place was not taken with the old one's key.
    expect(places.settle(sessionOf(renewed))?.socket).toBe(renewed)
    renewed.destroy()
    expect(places.open).toBe(0)
    expect(events).toEqual([])
  })
})
