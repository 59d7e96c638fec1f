// Edges of the connection caps' bookkeeping (services/grpc/ConnectionCaps.ts) that connection-guard-rules.test.ts
// leaves open: a second cool-down of a peer already cooling, the end of a cool-down when the table of them is full,
// and a connection that settles after it was released. Pure.
import { describe, expect, it } from "vitest"
import {
  ConnectionCaps,
  FLOOD_COOLDOWN_MS,
  IdleOrder,
  type Idling,
  SETTLED_IDLE_MS
} from "../../src/services/grpc/ConnectionCaps.ts"

/** ConnectionCaps.ts MAX_COOLDOWNS (not exported): the most peers kept in cool-down at once. */
const MAX_COOLDOWNS = 10_000

describe("ConnectionCaps cool-downs", () => {
  it("a shorter cool-down given later never shortens one a peer is already serving", () => {
    const caps = new ConnectionCaps({ perPeer: 0, total: 0 })
    caps.cooldown("a", 0) // until FLOOD_COOLDOWN_MS
    caps.cooldown("a", 1_000, 100) // until 1,100: the longer one stands
    expect(caps.admit("a", 5_000)).toBe("cooldown")
    expect(caps.admit("a", FLOOD_COOLDOWN_MS)).toBeUndefined()
  })

  it(`with ${MAX_COOLDOWNS} peers cooling, a new one is dropped; once theirs end (at their end, exclusive) it is kept`, () => {
    const caps = new ConnectionCaps({ perPeer: 0, total: 0 })
    for (let i = 0; i < MAX_COOLDOWNS; i++) caps.cooldown(`10.0.${i >> 8}.${i & 255}`, 0, 1_000)
    // All still cooling at 999: no room, the bound on memory drops the new one.
    caps.cooldown("late", 999, 1_000)
    expect(caps.admit("late", 1_000)).toBeUndefined()
    caps.release("late")
    // At 1,000 every one of them is over (admit lets them in from 1,000 too): the full table forgets them, making room.
    caps.cooldown("flooder", 1_000, 1_000)
    expect(caps.admit("flooder", 1_999)).toBe("cooldown")
    expect(caps.admit("10.0.0.0", 1_000)).toBeUndefined()
  })
})

describe("IdleOrder: a released connection", () => {
  type C = Idling & { readonly name: string }
  const alive = () => true

  it("is never named for a new one, though its handshake completes after it was closed", () => {
    const o = new IdleOrder<C>()
    const x: C = { name: "x", peer: "a", handshakeSinceMs: 0, calls: 0, idleSinceMs: 0, released: false }
    o.accepted(x)
    o.released(x) // closed mid-handshake
    o.settled(x, 10) // the session's creation reported late
    for (const [atCap, plaintext] of [
      [true, true],
      [false, true]
    ] as const)
      expect(o.victim("a", atCap, 10 + SETTLED_IDLE_MS, alive, plaintext)).toBeUndefined()
  })
})
