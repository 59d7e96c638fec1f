// The guard's pure rules: the connection caps, cool-downs and the choice of a connection to close past a cap
// (services/grpc/ConnectionCaps.ts), the flood rule and
// the reading of node:http2's session errors (services/grpc/FloodRule.ts), and the rate-limited log
// (services/observability/RateLimitedLog.ts).

import { Effect, Logger } from "effect"
import { describe, expect, it } from "vitest"
import { guardReport } from "../../src/layers/grpc/guardReport.ts"
import {
  ConnectionCaps,
  FLOOD_COOLDOWN_MS,
  IdleOrder,
  type Idling,
  peerOf,
  SETTLED_IDLE_MS,
  STALE_HANDSHAKE_MS
} from "../../src/services/grpc/ConnectionCaps.ts"
import {
  answeredBytes,
  chunkBytes,
  closedReason,
  FLOOD_LIMITS,
  floodStep,
  fullBucket,
  headerListBytes,
  PEER_FLOOD_LIMITS,
  PEER_FLOOD_MIN_BYTES,
  PEER_RESET_BURST,
  PEER_RESET_RATE,
  PING_FRAME_BYTES,
  peerFloodStep,
  REFUSAL_BURST,
  REFUSAL_RATE,
  refilled,
  resetMirror,
  resetStep,
  STREAM_FRAME_BYTES,
  unreadCredit,
  wasted,
  wasteStep
} from "../../src/services/grpc/FloodRule.ts"
import { OVERFLOW_KEY, RateLimitedLog } from "../../src/services/observability/RateLimitedLog.ts"

describe("ConnectionCaps", () => {
  it("admits up to the per-peer cap, counts closed connections out, and caps the total", () => {
    const caps = new ConnectionCaps({ perPeer: 2, total: 3 })
    expect(caps.admit("a", 0)).toBeUndefined()
    expect(caps.admit("a", 0)).toBeUndefined()
    expect(caps.admit("a", 0)).toBe("peer_limit")
    expect(caps.admit("b", 0)).toBeUndefined()
    expect(caps.admit("c", 0)).toBe("total_limit")
    expect([caps.open(), caps.open("a"), caps.open("c")]).toEqual([3, 2, 0])
    caps.release("a")
    expect(caps.admit("c", 0)).toBeUndefined()
    caps.release("nobody")
    expect(caps.open()).toBe(3)
    expect(caps.atPeerCap("a")).toBe(false)
    // Past both caps: refused for its own (a place of its own frees one under both).
    const both = new ConnectionCaps({ perPeer: 1, total: 1 })
    expect(both.admit("a", 0)).toBeUndefined()
    expect(both.admit("a", 0)).toBe("peer_limit")
    expect(both.atPeerCap("a")).toBe(true)
    expect(both.admit("b", 0)).toBe("total_limit")
  })

  it("0 is no cap", () => {
    const caps = new ConnectionCaps({ perPeer: 0, total: 0 })
    for (let i = 0; i < 10_000; i++) expect(caps.admit("a", 0)).toBeUndefined()
  })

  it("refuses a peer in cool-down until it is over, whatever its count", () => {
    const caps = new ConnectionCaps({ perPeer: 10, total: 0 })
    caps.cooldown("a", 1_000)
    expect(caps.admit("a", 1_000 + FLOOD_COOLDOWN_MS - 1)).toBe("cooldown")
    expect(caps.admit("b", 1_000)).toBeUndefined()
    expect(caps.admit("a", 1_000 + FLOOD_COOLDOWN_MS)).toBeUndefined()
  })

  describe("IdleOrder: the connection closed for one past a cap", () => {
    type C = Idling & { readonly name: string }
    const c = (name: string, peer: string, handshakeSinceMs: number): C => ({
      name,
      peer,
      handshakeSinceMs,
      calls: 0,
      idleSinceMs: 0,
      released: false
    })
    const alive = () => true
    /** `o` with connections of `peer` past their handshake at `at`, named as given. */
    const settledAt = (o: IdleOrder<C>, peer: string, at: number, ...names: Array<string>) =>
      names.map((name) => {
        const x = c(name, peer, at)
        o.accepted(x)
        o.settled(x, at)
        return x
      })
    const T = 100_000

    it(`at a peer's cap, its own connection idle the longest, once idle ${SETTLED_IDLE_MS} ms; busy ones never`, () => {
      const o = new IdleOrder<C>()
      const [a1, a2, a3] = settledAt(o, "a", 0, "a1", "a2", "a3")
      settledAt(o, "b", 0, "b1")
      // a1 runs a call and ends it at T: idle since then, after a2 and a3.
      o.opened(a1!)
      o.closed(a1!, T)
      o.opened(a3!)
      expect(o.victim("a", true, T, alive, true)?.name).toBe("a2")
      o.opened(a2!)
      expect(o.victim("a", true, T, alive, true)).toBeUndefined()
      expect(o.victim("a", true, T + SETTLED_IDLE_MS, alive, true)?.name).toBe("a1")
      o.opened(a1!)
      expect(o.victim("a", true, T + SETTLED_IDLE_MS, alive, true)).toBeUndefined()
      // Two calls at once, one ended: still busy; both: idle from then.
      o.opened(a3!)
      o.closed(a3!, T)
      expect(o.victim("a", true, T + SETTLED_IDLE_MS, alive, true)).toBeUndefined()
      o.closed(a3!, T + 1)
      expect(o.victim("a", true, T + 1 + SETTLED_IDLE_MS, alive, true)?.name).toBe("a3")
    })

    it(`a connection in its TLS handshake for ${STALE_HANDSHAKE_MS} ms or more before any idle one, the longest first; a fresh one never`, () => {
      const o = new IdleOrder<C>()
      settledAt(o, "a", 0, "idle")
      const [staler, stale, fresh] = [
        c("staler", "a", T - 5_000),
        c("stale", "a", T - STALE_HANDSHAKE_MS),
        c("fresh", "a", T - STALE_HANDSHAKE_MS + 1)
      ]
      for (const x of [staler!, stale!, fresh!]) o.accepted(x)
      expect(o.victim("a", true, T, alive, false)?.name).toBe("staler")
      o.released(staler!)
      expect(o.victim("a", true, T, alive, true)?.name).toBe("stale")
      o.settled(stale!, T)
      o.opened(stale!)
      // The oldest handshake left is fresh: the idle one goes, on a plaintext listener; under TLS none.
      expect(o.victim("a", true, T, alive, true)?.name).toBe("idle")
      expect(o.victim("a", true, T, alive, false)).toBeUndefined()
      expect(o.victim("b", true, T, alive, true)).toBeUndefined()
    })

    it("at the total cap alone: any peer's stale handshake, then on a plaintext listener the peer's own idle one, then another's; under TLS stale handshakes only", () => {
      const o = new IdleOrder<C>()
      settledAt(o, "router", 0, "router-idle")
      const knocking = c("knocking", "x", T - STALE_HANDSHAKE_MS)
      o.accepted(knocking)
      expect(o.victim("new", false, T, alive, false)?.name).toBe("knocking")
      o.released(knocking)
      expect(o.victim("new", false, T, alive, false)).toBeUndefined()
      expect(o.victim("new", false, T, alive, true)?.name).toBe("router-idle")
      settledAt(o, "new", 0, "own-idle")
      expect(o.victim("new", false, T, alive, true)?.name).toBe("own-idle")
      expect(o.victim("new", false, T, alive, false)).toBeUndefined()
      // Under TLS at its own cap too: an authenticated idle connection of the same address is never taken.
      expect(o.victim("new", true, T, alive, false)).toBeUndefined()
    })

    it("at a peer's own cap, another peer's stale handshake is not closed: that would free no place under its cap", () => {
      // ConnectionCaps.ts victim: "At its own cap (`atPeerCap`) one of its own, which frees a place under both caps";
      // README: one more is admitted "in place of one of the address's connections that runs no call"
      const o = new IdleOrder<C>()
      const [busy] = settledAt(o, "a", 0, "a-busy")
      o.opened(busy!)
      o.accepted(c("b-knocking", "b", T - 5_000))
      for (const plaintext of [true, false])
        expect(o.victim("a", true, T, alive, plaintext), String(plaintext)).toBeUndefined()
      // at the total cap alone it would be the one
      expect(o.victim("a", false, T, alive, false)?.name).toBe("b-knocking")
    })

    it("forgets a connection closed with a call open for good, though its stream closes after (a client's close)", () => {
      const o = new IdleOrder<C>()
      const [x] = settledAt(o, "a", 0, "x")
      o.opened(x!)
      o.released(x!)
      o.closed(x!, 1)
      expect(o.victim("a", true, T, alive, true)).toBeUndefined()
      expect(o.victim("z", false, T, alive, true)).toBeUndefined()
    })

    it("passes over connections already closing", () => {
      const o = new IdleOrder<C>()
      const [x] = settledAt(o, "a", 0, "x", "y")
      expect(o.victim("a", true, T, (v) => v !== x, true)?.name).toBe("y")
    })
  })

  it("takes an IPv4-mapped IPv6 address as the IPv4 peer", () => {
    expect(peerOf("::ffff:10.0.0.7")).toBe("10.0.0.7")
    expect(peerOf("10.0.0.7")).toBe("10.0.0.7")
    expect(peerOf("::ffff:a")).toBe("::ffff:a")
    expect(peerOf("fd00::1")).toBe("fd00::1")
    expect(peerOf(undefined)).toBe("unknown")
  })
})

describe("the flood rule", () => {
  const { floorBytesPerSec: floor, burstBytes: burst } = FLOOD_LIMITS

  it("counts as waste only the bytes read beyond what calls account for and what the agent wrote", () => {
    expect(wasted({ read: 1000, accounted: 600, written: 100 })).toBe(300)
    expect(wasted({ read: 1000, accounted: 600, written: 1000 })).toBe(0)
    // the acks of the client's own PINGs and SETTINGS are no writes of the agent's: 10 PINGs read, 10 acks written
    const pings = { read: 10 * PING_FRAME_BYTES, accounted: 0, written: 10 * PING_FRAME_BYTES }
    expect(wasted(pings)).toBe(0)
    expect(wasted({ ...pings, answered: answeredBytes(10, 0) })).toBe(10 * PING_FRAME_BYTES)
    expect(answeredBytes(2, 3)).toBe(2 * 17 + 3 * 9)
  })

  it("lets a connection waste the burst at once and the floor for ever; one more byte is a flood", () => {
    let b = fullBucket(0)
    let step = floodStep(b, { read: burst, accounted: 0, written: 0 }, 0)
    expect(step.flood).toBe(false)
    b = step.bucket
    // 60 s at the floor: never a flood.
    for (let t = 250; t <= 60_000; t += 250) {
      step = floodStep(b, { read: floor / 4, accounted: 0, written: 0 }, t)
      expect(step.flood).toBe(false)
      b = step.bucket
    }
    expect(floodStep(b, { read: 1, accounted: 0, written: 0 }, 60_000).flood).toBe(true)
  })

  it("a flood of 13-byte frames (the review's ~200 MB/s) is one in its first sample", () => {
    const read = 200e6 / 4
    expect(floodStep(fullBucket(0), { read, accounted: 0, written: 0 }, 250).flood).toBe(true)
  })

  it("a busy connection (its bytes all accounted for, or answering what the agent wrote) never is", () => {
    let b = fullBucket(0)
    for (let t = 250; t <= 600_000; t += 250) {
      const step = floodStep(b, { read: 50e6, accounted: 40e6, written: 20e6 }, t)
      expect(step.flood).toBe(false)
      b = step.bucket
    }
    expect(b.left).toBe(burst)
  })

  it("a peer's bucket holds four connections' worth: 64 connections each at its own floor flood it at once", () => {
    expect(PEER_FLOOD_LIMITS).toEqual({ floorBytesPerSec: 4 * floor, burstBytes: 4 * burst })
    const perSample = floor / 4
    let b = fullBucket(0, PEER_FLOOD_LIMITS)
    let t = 0
    let flood = false
    while (!flood && t < 60_000) {
      t += 250
      const step = wasteStep(b, 64 * perSample, t, PEER_FLOOD_LIMITS)
      b = step.bucket
      flood = step.flood
    }
    // (32 MiB) / (64 - 4 MiB/s) = 0.53 s: the third sample.
    expect(t).toBe(750)
    // Four such connections never do, and a connection under the closing threshold wastes under 4 KiB/s.
    b = fullBucket(0, PEER_FLOOD_LIMITS)
    for (let u = 250; u <= 600_000; u += 250) {
      const step = wasteStep(b, 4 * perSample, u, PEER_FLOOD_LIMITS)
      expect(step.flood).toBe(false)
      b = step.bucket
    }
    expect(PEER_FLOOD_MIN_BYTES * 4).toBeLessThanOrEqual(4096)
  })

  it("a peer's flood closes its connections that wasted 1 KiB in the sample, or the mean if that is less", () => {
    const full = fullBucket(0, PEER_FLOOD_LIMITS)
    const burst = PEER_FLOOD_LIMITS.burstBytes
    // within the bucket: nothing closed, whatever each wasted
    expect(peerFloodStep(full, [burst / 2, 10], 0).close).toEqual([])
    // past it: the big wasters, not the one that wasted a few bytes
    expect(peerFloodStep(full, [burst, burst, 10, PEER_FLOOD_MIN_BYTES], 0).close).toEqual([0, 1, 3])
    // 4,096 connections each wasting under the minimum (where max_connections_per_peer allows them): the mean
    const many = Array.from({ length: 4096 }, (_, i) => (i === 7 ? 0 : 900))
    const step = peerFloodStep({ left: 0, atMs: 0 }, many, 0)
    expect(step.close).toHaveLength(4095)
    expect(step.close).not.toContain(7)
  })

  it("a peer's bucket is never owed more than its burst: full again about 2 x burst / floor after the flood", () => {
    let b = fullBucket(0, PEER_FLOOD_LIMITS)
    for (let t = 250; t <= 60_000; t += 250) b = peerFloodStep(b, [64 << 20], t).bucket
    expect(b.left).toBe(-PEER_FLOOD_LIMITS.burstBytes)
    const back = 60_000 + (2 * PEER_FLOOD_LIMITS.burstBytes * 1000) / PEER_FLOOD_LIMITS.floorBytesPerSec
    expect(refilled(b, back - 1000, PEER_FLOOD_LIMITS)).toBeLessThan(PEER_FLOOD_LIMITS.burstBytes)
    expect(refilled(b, back, PEER_FLOOD_LIMITS)).toBe(PEER_FLOOD_LIMITS.burstBytes)
  })

  it("refills a bucket at the floor up to the burst; floodStep is wasteStep of a sample's waste", () => {
    const b = { left: -100, atMs: 1_000 }
    expect(refilled(b, 1_500, FLOOD_LIMITS)).toBe(floor / 2 - 100)
    expect(refilled(b, 1_000 + 3_600_000, FLOOD_LIMITS)).toBe(burst)
    expect(refilled(b, 500, FLOOD_LIMITS)).toBe(-100)
    const sample = { read: 5000, accounted: 1000, written: 500 }
    expect(floodStep(b, sample, 2_000)).toEqual(wasteStep(b, 3500, 2_000))
  })

  it("credits a stopped request what its caller may still send: the stream's window, a frame header per KiB", () => {
    // Nothing read yet: the whole initial window (65,535 bytes) and 64 frame headers.
    expect(unreadCredit(65_535, 0)).toBe(65_535 + 9 * 64)
    // 60,000 read and its window given back as read: the window left (larger than 65,535 - 60,000).
    expect(unreadCredit(65_535, 60_000)).toBe(65_535 + 9 * 64)
    // The window not given back: what the initial window leaves.
    expect(unreadCredit(0, 60_000)).toBe(5_535 + 9 * 6)
    // Never more than the initial window, nor less than nothing.
    expect(unreadCredit(1 << 20, 0)).toBe(65_535 + 9 * 64)
    expect(unreadCredit(0, 1 << 20)).toBe(0)
    expect(unreadCredit(0, 0, 1 << 20)).toBe((1 << 20) + 9 * 1024)
  })

  it("a request sent in 1-byte DATA frames is its call's bytes, not waste: each chunk is accounted with its 9-byte frame header", () => {
    // A million such chunks (10 MB on the wire) in one sample: their frame headers alone would be past the burst.
    const chunks = 1_000_000
    const sample = { read: chunks * (9 + 1), accounted: chunks * chunkBytes(1), written: 0 }
    expect(floodStep(fullBucket(0), sample, 250).flood).toBe(false)
    expect(wasted(sample)).toBe(0)
  })

  it("a call's own frames (HEADERS, RST_STREAM, WINDOW_UPDATEs) are accounted with it; 200 bytes of other frames per call are waste", () => {
    const headers = {
      ":method": "POST",
      ":path": "/cgn.agent.v1.Agent/Generate",
      "content-type": "application/grpc",
      te: "trailers"
    }
    // What the guard accounts per call (Guard.onStream); its HPACK block on the wire is never larger than the list.
    const accounted = headerListBytes(headers) + STREAM_FRAME_BYTES
    const onWire = (extra: number) => headerListBytes(headers) + 9 + 13 + 2 * 13 + extra
    /** When 10,000 calls a second, each with `extra` bytes of frames no call needs, first flood (ms; Infinity: a minute). */
    const floodsAt = (extra: number) => {
      let b = fullBucket(0)
      for (let t = 250; t <= 60_000; t += 250) {
        const step = floodStep(b, { read: 2_500 * onWire(extra), accounted: 2_500 * accounted, written: 0 }, t)
        if (step.flood) return t
        b = step.bucket
      }
      return Number.POSITIVE_INFINITY
    }
    expect(floodsAt(0)).toBe(Number.POSITIVE_INFINITY)
    // ~1.8 MB/s wasted: the 8 MiB burst is spent in about 11 s at the 1 MiB/s floor.
    expect(floodsAt(200)).toBeLessThan(15_000)
  })

  it("sizes a header list as RFC 9113 6.5.2 does", () => {
    expect(headerListBytes({ ":path": "/a", te: "trailers", "x-b": ["1", "22"], absent: undefined })).toBe(
      5 + 2 + 32 + (2 + 8 + 32) + (3 + 1 + 32) + (3 + 2 + 32)
    )
  })
})

describe("reading node:http2's session errors", () => {
  it("nghttp2's flood detection is control_flood; a protocol error past the reset budget reset_flood, else protocol_error", () => {
    let m = resetMirror(10, 0)
    expect(closedReason(-904, m)).toBe("control_flood")
    expect(closedReason(-905, m)).toBe("control_flood")
    expect(closedReason(-505, m)).toBe("protocol_error")
    for (let i = 0; i < 11; i++) m = resetStep(m, 0, 10, 1)
    expect(closedReason(-505, m)).toBe("reset_flood")
    // The budget refills at the rate: 2 s later 2 more streams are within it.
    m = resetStep(m, 2_000, 10, 1)
    expect(m.left).toBe(0)
    expect(closedReason(-505, m)).toBe("protocol_error")
    expect(closedReason(-505, m, 1)).toBe("reset_flood")
    // Not an HTTP/2 verdict (a socket error): nothing to report.
    expect(closedReason(undefined, m)).toBeUndefined()
    expect(closedReason(-104, m)).toBeUndefined()
  })
})

describe("a peer's stream reset budget", () => {
  /** How long `perSec` resets a second, evenly spread, stay within the peer's budget (ms; Infinity: 10 minutes). */
  const lasts = (perSec: number, burst = 0) => {
    let m = resetMirror(PEER_RESET_BURST, 0)
    for (let i = 0; i < burst; i++) m = resetStep(m, 0, PEER_RESET_BURST, PEER_RESET_RATE)
    for (let t = 0; t <= 600_000; t += 1000 / perSec) {
      m = resetStep(m, t, PEER_RESET_BURST, PEER_RESET_RATE)
      if (m.left < 0) return t
    }
    return Number.POSITIVE_INFINITY
  }

  it("takes a burst of 40,000 at once (a router's hedged calls on four connections), then 1,000 a second for ever", () => {
    expect(lasts(1_000)).toBe(Number.POSITIVE_INFINITY)
    expect(lasts(1_000, 39_999)).toBe(Number.POSITIVE_INFINITY)
    // The re-check's 4,000 a second (about a core) is over in about 13 s, twice that in about 5 s.
    expect(lasts(4_000)).toBeCloseTo(40_000 / 3, -2)
    expect(lasts(8_000)).toBeCloseTo(40_000 / 7, -2)
  })
})

describe("a connection's refusal budget (streams refused before any handler)", () => {
  /** When refusals `perSec` a second, evenly spread after `burst` at once, first leave the budget (ms; Infinity: 10 minutes). */
  const closedAt = (perSec: number, burst: number) => {
    let m = resetMirror(REFUSAL_BURST, 0)
    for (let i = 0; i < burst; i++) m = resetStep(m, 0, REFUSAL_BURST, REFUSAL_RATE)
    if (m.left < 0) return 0
    for (let t = 1000 / perSec; t <= 600_000; t += 1000 / perSec) {
      m = resetStep(m, t, REFUSAL_BURST, REFUSAL_RATE)
      if (m.left < 0) return t
    }
    return Number.POSITIVE_INFINITY
  }

  it("takes 1,000 at once, then 100 a second for ever (README); one more at once, or 101 a second after them, closes", () => {
    expect(closedAt(100, 1_000)).toBe(Number.POSITIVE_INFINITY)
    expect(closedAt(99, 1_000)).toBe(Number.POSITIVE_INFINITY)
    expect(closedAt(100, 1_001)).toBe(0)
    expect(closedAt(101, 1_000)).toBeLessThan(1_000)
    // From a full budget, 110 a second spend its 1,000 in 100 s (10 a second over the rate).
    expect(closedAt(110, 0)).toBeCloseTo(100_000, -3)
  })
})

describe("RateLimitedLog", () => {
  it("logs a key's first event, then one per interval with the count suppressed since", () => {
    const log = new RateLimitedLog(1_000)
    expect(log.note("a", 0)).toEqual({ key: "a", suppressed: 0 })
    expect(log.note("a", 10)).toBeUndefined()
    expect(log.note("a", 999)).toBeUndefined()
    expect(log.note("b", 999)).toEqual({ key: "b", suppressed: 0 })
    expect(log.note("a", 1_000)).toEqual({ key: "a", suppressed: 2 })
    expect(log.note("a", 1_001)).toBeUndefined()
  })

  it("past its keys, new keys share one overflow key; keys whose interval is over are forgotten first", () => {
    const log = new RateLimitedLog(1_000, 2)
    log.note("a", 0)
    log.note("b", 0)
    expect(log.note("c", 10)).toEqual({ key: OVERFLOW_KEY, suppressed: 0 })
    expect(log.note("d", 20)).toBeUndefined()
    expect(log.note("c", 1_500)).toEqual({ key: "c", suppressed: 0 })
  })

  it("by default, one line per key a minute (README: once a minute per client address), at most 1024 keys", () => {
    const log = new RateLimitedLog()
    expect(log.note("p", 0)).toEqual({ key: "p", suppressed: 0 })
    expect(log.note("p", 59_999)).toBeUndefined()
    expect(log.note("p", 60_000)).toEqual({ key: "p", suppressed: 1 })
    const bounded = new RateLimitedLog()
    for (let i = 0; i < 1024; i++) expect(bounded.note(`p${i}`, 0)?.key).toBe(`p${i}`)
    expect(bounded.note("one-too-many", 1)?.key).toBe(OVERFLOW_KEY)
  })
})

describe("guardReport: the guard's warning lines", () => {
  /** The report's warnings as [message, fields], Metrics absent. */
  const report = () => {
    const lines: Array<[unknown, Record<string, unknown>]> = []
    const logger = Logger.make(({ message }) => {
      const [text, fields] = [message].flat() as [unknown, Record<string, unknown>]
      lines.push([text, fields])
    })
    const onGuard = guardReport((e) => Effect.runSync(e.pipe(Effect.provide(Logger.layer([logger])))), undefined)
    return { onGuard, lines }
  }

  it("say what the event carries: the cap that refused, the certificate's fault, the bytes a flood wasted, the peer a connection made room for", () => {
    const { onGuard, lines } = report()
    onGuard({ kind: "refused", reason: "peer_limit", peer: "10.0.0.1", limit: 4 })
    onGuard({ kind: "refused", reason: "cooldown", peer: "10.0.0.1", limit: 0 }) // no cap involved: no limit field
    onGuard({ kind: "refused", reason: "client_certificate", peer: "10.0.0.2", limit: 0, detail: "CERT_HAS_EXPIRED" })
    onGuard({ kind: "closed", reason: "frame_flood", peer: "10.0.0.3", bytes: 8_388_608 })
    onGuard({ kind: "closed", reason: "idle_evicted", peer: "10.0.0.4:5000", forPeer: "10.0.0.4:5001" }) // README: for_peer
    expect(lines.map(([, f]) => f)).toEqual([
      { peer: "10.0.0.1", reason: "peer_limit", suppressed: 0, limit: 4 },
      { peer: "10.0.0.1", reason: "cooldown", suppressed: 0 },
      { peer: "10.0.0.2", reason: "client_certificate", suppressed: 0, certificate: "CERT_HAS_EXPIRED" },
      { peer: "10.0.0.3", reason: "frame_flood", suppressed: 0, wasted_bytes: 8_388_608 },
      { peer: "10.0.0.4:5000", reason: "idle_evicted", suppressed: 0, for_peer: "10.0.0.4:5001" }
    ])
  })

  it("refused certificates: a line a minute per peer and certificate reason, so one unnamed peer's fault hides no other's", () => {
    const { onGuard, lines } = report()
    // node:tls no longer gives the address of a client it refused a certificate of: every such peer is "unknown"
    onGuard({ kind: "refused", reason: "client_certificate", peer: "unknown", limit: 0, detail: "CERT_HAS_EXPIRED" })
    onGuard({ kind: "refused", reason: "client_certificate", peer: "unknown", limit: 0, detail: "CERT_HAS_EXPIRED" })
    onGuard({
      kind: "refused",
      reason: "client_certificate",
      peer: "unknown",
      limit: 0,
      detail: "UNABLE_TO_VERIFY_LEAF_SIGNATURE"
    })
    onGuard({
      kind: "refused",
      reason: "client_certificate",
      peer: "10.0.0.9",
      limit: 0,
      detail: "NO_CLIENT_CERTIFICATE"
    })
    expect(lines.map(([, f]) => [f.peer, f.certificate])).toEqual([
      ["unknown", "CERT_HAS_EXPIRED"],
      ["unknown", "UNABLE_TO_VERIFY_LEAF_SIGNATURE"],
      ["10.0.0.9", "NO_CLIENT_CERTIFICATE"]
    ])
  })

  it("past the log's 1024 keys, a line for the shared overflow key names no one peer but '(many peers)'", () => {
    const { onGuard, lines } = report()
    for (let i = 0; i <= 1024; i++)
      onGuard({ kind: "closed", reason: "protocol_error", peer: `10.1.${i >> 8}.${i & 255}` })
    expect(lines).toHaveLength(1025)
    expect(lines[1023]![1].peer).toBe("10.1.3.255")
    expect(lines[1024]![1].peer).toBe("(many peers)")
  })
})
