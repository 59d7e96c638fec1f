// What calls on a node need from their slot (services/grpc/ServiceTimes.ts), and the ledger's shedding of calls
// that can no longer meet their deadline (services/grpc/Admission.ts AdmissionLedger): pure, by tables.
import { describe, expect, it } from "vitest"
import { AdmissionLedger } from "../../src/services/grpc/Admission.ts"
import {
  cannotFinish,
  lowPercentile,
  MIN_SAMPLES,
  ServiceTimes,
  ServiceTimeWindow,
  WINDOW
} from "../../src/services/grpc/ServiceTimes.ts"

const filled = (values: ReadonlyArray<number>, w = new ServiceTimeWindow()) => {
  for (const v of values) w.record(v)
  return w
}
const range = (n: number, f: (i: number) => number) => Array.from({ length: n }, (_, i) => f(i))

describe("ServiceTimeWindow", () => {
  it("no estimate (never shed) before MIN_SAMPLES calls; then the fastest of a few", () => {
    const w = filled(range(MIN_SAMPLES - 1, (i) => 1000 + i))
    expect(w.estimate()).toBeUndefined()
    w.record(700)
    expect([w.count, w.estimate()]).toEqual([MIN_SAMPLES, 700])
    // README: "the 10th percentile of the last 64 measured; none before 4"
    const three = filled([900, 800, 700])
    expect(three.estimate()).toBeUndefined()
    three.record(600)
    expect(three.estimate()).toBe(600)
  })

  it("a full window: its 10th percentile by nearest rank, one slow outlier or fast cache hit barely moves it", () => {
    // 64 samples: the 7th fastest. Six cache hits at 5 ms are below it; the 7th value is a real prefill time.
    const w = filled([...range(6, () => 5), ...range(WINDOW - 6, (i) => 900 + i)])
    expect(w.estimate()).toBe(900)
    // A minute-long outlier pushes out the oldest sample (a 5 ms hit): the estimate moves one rank, to 901.
    w.record(60_000)
    expect(w.estimate()).toBe(901)
  })

  it("keeps the last WINDOW calls only: it follows the node when it gets faster or slower", () => {
    const w = filled(range(WINDOW, () => 2000))
    expect(w.estimate()).toBe(2000)
    filled(
      range(WINDOW, () => 400),
      w
    )
    expect(w.estimate()).toBe(400)
    filled(
      range(WINDOW - 7, () => 1500),
      w
    )
    // 7 of the 400s remain: the 7th fastest is still one of them; one more and it moves.
    expect(w.estimate()).toBe(400)
    w.record(1500)
    expect(w.estimate()).toBe(1500)
  })

  it("ignores values that are no time (negative, NaN, infinite)", () => {
    const w = filled([-1, Number.NaN, Number.POSITIVE_INFINITY])
    expect(w.count).toBe(0)
  })

  it("rejects a size or minimum that cannot work", () => {
    expect(() => new ServiceTimeWindow(0)).toThrow(RangeError)
    expect(() => new ServiceTimeWindow(4, 5)).toThrow(RangeError)
    expect(() => new ServiceTimeWindow(4, 0)).toThrow(RangeError)
  })

  it("lowPercentile: nearest rank, never interpolated", () => {
    expect(lowPercentile(Float64Array.of(3, 1, 2))).toBe(1)
    expect(lowPercentile(Float64Array.from(range(20, (i) => 20 - i)))).toBe(2)
    expect(lowPercentile(Float64Array.from(range(21, (i) => i + 1)))).toBe(3)
  })
})

describe("ServiceTimes", () => {
  it("one window per kind; /status shows the estimates there are, rounded", () => {
    const t = new ServiceTimes(() => new ServiceTimeWindow(4, 2))
    t.record("prefill", 900.4)
    expect(t.need("prefill")).toBeUndefined()
    t.record("prefill", 1200)
    t.record("decode", 50)
    expect([t.need("prefill"), t.need("decode"), t.need("normal")]).toEqual([900.4, undefined, undefined])
    expect(t.snapshot()).toEqual({ prefill: 900 })
  })
})

describe("cannotFinish", () => {
  it.each([
    [120, 900, true],
    [899, 900, true],
    [900, 900, false],
    [5000, 900, false],
    [-5, 900, true],
    [120, undefined, false],
    [undefined, 900, false]
  ] as const)("%s ms left, %s ms needed: %s", (left, need, shed) => {
    expect(cannotFinish(left, need)).toBe(shed)
  })
})

describe("AdmissionLedger shedding", () => {
  it("at arrival: a call too late to wait is shed only when it would wait; a free slot still takes it", () => {
    const ledger = new AdmissionLedger<string>(1, 2)
    expect(ledger.enter("a", true)).toBe("admitted")
    expect(ledger.enter("b", true)).toBe("shed")
    expect(ledger.enter("c", false)).toBe("queued")
    expect(ledger.enter("d", true)).toBe("shed")
    expect(ledger.enter("e", false)).toBe("queued")
    // A full queue refuses as before, whatever the deadline.
    expect(ledger.enter("f", true)).toBe("overloaded")
    expect(ledger.stats()).toMatchObject({
      inflight: 1,
      queued: 2,
      shedAtArrival: 2,
      refusedOverloaded: 1,
      admitted: 1
    })
  })

  it("at the slot: the waiters shed are skipped in order, the slot goes to the first that can still finish", () => {
    const ledger = new AdmissionLedger<string>(1, 4)
    for (const w of ["h", "late1", "ok1", "late2", "ok2"]) ledger.enter(w)
    const offered: Array<string> = []
    const shed = (w: string) => {
      offered.push(w)
      return w.startsWith("late")
    }
    expect(ledger.release(shed)).toBe("ok1")
    expect(ledger.release(shed)).toBe("ok2")
    expect(offered).toEqual(["late1", "ok1", "late2", "ok2"])
    expect(ledger.stats()).toMatchObject({ inflight: 1, queued: 0, shedAtSlot: 2, admitted: 3 })
  })

  it("at the slot: when every waiter is shed the slot is free again", () => {
    const ledger = new AdmissionLedger<string>(1, 2)
    for (const w of ["h", "late1", "late2"]) ledger.enter(w)
    expect(ledger.release(() => true)).toBeUndefined()
    expect([ledger.inflight, ledger.queued, ledger.idle, ledger.stats().shedAtSlot]).toEqual([0, 0, true, 2])
  })
})
