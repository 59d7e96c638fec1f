// The engine's progress rule (services/engine/EngineProgress.ts) and how its verdict enters the stall state
// (services/engine/EngineStall.ts): proof of no progress, never slowness. A healthy busy engine, a vLLM whose gauges
// are stale after every request was aborted, an SGLang prefill leg waiting for its decode peer, a failed scrape:
// none of them is stuck. Work held by both the engine and the agent, and no counter moved for the window: stuck.
import { describe, expect, it } from "vitest"
import {
  noWatch,
  observeProgress,
  type ProgressReading,
  progressReading
} from "../../src/services/engine/EngineProgress.ts"
import {
  isStalled,
  noStall,
  onCompleted,
  onNoProgress,
  onProgress,
  onStall,
  stallProblem,
  stallRestartAt,
  stallStart
} from "../../src/services/engine/EngineStall.ts"

const WINDOW = 10_000
const P = "vllm:prompt_tokens_total"
const G = "vllm:generation_tokens_total"

const read = (at: number, p: number, g: number, held = 3, inflight = 2): ProgressReading => ({
  at,
  counters: { [P]: p, [G]: g },
  held,
  inflight
})

/** The verdicts of a run of scrapes (undefined: a failed one), from no watch. */
const verdicts = (readings: ReadonlyArray<ProgressReading | undefined>) => {
  let w = noWatch
  return readings.map((r) => {
    const [next, v] = observeProgress(w, r, WINDOW)
    w = next
    return v._tag
  })
}

describe("observeProgress", () => {
  it("work held and no counter moved for the window: stuck, from the first still scrape", () => {
    expect(verdicts([read(0, 100, 50), read(5_000, 100, 50), read(14_999, 100, 50), read(15_000, 100, 50)])).toEqual([
      "Unknown",
      "Still",
      "Still",
      "Stuck"
    ])
    let w = noWatch
    for (const at of [0, 5_000]) w = observeProgress(w, read(at, 100, 50), WINDOW)[0]
    const [, v] = observeProgress(w, read(15_000, 100, 50), WINDOW)
    expect(v).toEqual({ _tag: "Stuck", since: 5_000, held: 3, counters: [P, G] })
  })

  it("any counter that moves is progress and starts the window over: a busy engine is never stuck", () => {
    const busy = Array.from({ length: 20 }, (_, i) => read(i * 5_000, 100 + (i % 2 === 0 ? i : 0), 50 + i))
    expect(verdicts(busy).filter((v) => v === "Stuck")).toEqual([])
    // the prompt counter alone (a prefill node: max_tokens 1 legs) moving now and then is enough
    const prefill = [0, 4, 8, 12, 16, 20, 24].map((s, i) => read(s * 1_000, 100 + Math.floor(i / 2), 50))
    expect(verdicts(prefill)).not.toContain("Stuck")
  })

  it("a counter that goes down (a new engine process), appears or disappears is progress", () => {
    let w = observeProgress(noWatch, read(0, 100, 50), WINDOW)[0]
    w = observeProgress(w, read(5_000, 100, 50), WINDOW)[0]
    expect(observeProgress(w, read(20_000, 0, 0), WINDOW)[1]._tag).toBe("Moved")
    const one: ProgressReading = { at: 0, counters: { [P]: 1 }, held: 1, inflight: 1 }
    const w1 = observeProgress(noWatch, one, WINDOW)[0]
    expect(observeProgress(w1, { ...one, at: 20_000, counters: { [P]: 1, [G]: 0 } }, WINDOW)[1]._tag).toBe("Moved")
    // one that disappears is no proof that it stood still (proof of no progress, never its absence): the run starts over
    let w2 = observeProgress(noWatch, read(0, 100, 50), WINDOW)[0]
    w2 = observeProgress(w2, read(5_000, 100, 50), WINDOW)[0]
    expect(observeProgress(w2, { ...one, at: 20_000, counters: { [P]: 100 } }, WINDOW)[1]._tag).toBe("Moved")
  })

  it("no work held ends the run: the engine idle, or the agent with nothing in flight (vLLM's stale gauges)", () => {
    // vllm-project/vllm #22545: after every request was aborted the gauges keep their busy figures, the engine idle
    expect(verdicts([read(0, 1, 1), read(5_000, 1, 1, 106, 0), read(50_000, 1, 1, 106, 0)])).toEqual([
      "Unknown",
      "Idle",
      "Idle"
    ])
    // an SGLang prefill leg waits for its decode peer outside the running and waiting queues
    expect(verdicts([read(0, 1, 1), read(5_000, 1, 1, 0, 4), read(50_000, 1, 1, 0, 4)])).toEqual([
      "Unknown",
      "Idle",
      "Idle"
    ])
    // an idle scrape in the middle starts the window over
    expect(
      verdicts([read(0, 1, 1), read(5_000, 1, 1), read(10_000, 1, 1, 0), read(15_000, 1, 1), read(24_999, 1, 1)])
    ).toEqual(["Unknown", "Still", "Idle", "Still", "Still"])
  })

  it("a failed scrape, or one without the counters or the gauges, says nothing either way", () => {
    expect(verdicts([undefined, undefined])).toEqual(["Unknown", "Unknown"])
    // failed scrapes neither end the run nor hide a move: the counters are compared with the last ones seen
    expect(verdicts([read(0, 1, 1), read(5_000, 1, 1), undefined, read(15_000, 1, 1)])).toEqual([
      "Unknown",
      "Still",
      "Unknown",
      "Stuck"
    ])
    expect(verdicts([read(0, 1, 1), read(5_000, 1, 1), undefined, read(15_000, 1, 2)])).toEqual([
      "Unknown",
      "Still",
      "Unknown",
      "Moved"
    ])
    const noCounters: ProgressReading = { at: 20_000, counters: {}, held: 3, inflight: 1 }
    const noGauges: ProgressReading = { ...read(20_000, 1, 1), held: undefined }
    expect(verdicts([read(0, 1, 1), read(5_000, 1, 1), noCounters, noGauges])).toEqual([
      "Unknown",
      "Still",
      "Unknown",
      "Unknown"
    ])
    expect(verdicts([noCounters, noCounters])).toEqual(["Unknown", "Unknown"])
  })

  // One long chunked prefill alone: vLLM's counters stand still until it is done, but its KV-cache usage grows with
  // each chunk; a hung core freezes both (a review's case: the counters alone read a healthy engine as stuck).
  it("a gauge that moves is progress; the verdict names only the counters", () => {
    const scrape = (at: number, kv: number) =>
      progressReading({ running: 1, waiting: 0, kvUsage: kv, progress: { [P]: 100, [G]: 50 } }, at, 1)
    let w = noWatch
    const verdicts: Array<string> = []
    for (const [at, kv] of [
      [0, 0.1],
      [6_000, 0.2],
      [12_000, 0.3],
      [18_000, 0.3],
      [30_000, 0.3]
    ] as const) {
      const [next, v] = observeProgress(w, scrape(at, kv), WINDOW)
      w = next
      verdicts.push(v._tag === "Stuck" ? `Stuck ${v.counters.join(",")}` : v._tag)
    }
    expect(verdicts).toEqual(["Unknown", "Moved", "Moved", "Still", `Stuck ${P},${G}`])
  })

  it("progressReading: running + waiting held, a failed scrape undefined", () => {
    expect(progressReading({ running: 2, waiting: 1, kvUsage: 0.25, progress: { [P]: 7 } }, 9, 4)).toEqual({
      at: 9,
      counters: { [P]: 7, "gauge:running": 2, "gauge:waiting": 1, "gauge:kv_usage": 0.25 },
      held: 3,
      inflight: 4
    })
    // gauges alone (no progress counters) never start the rule
    expect(progressReading({ running: 2, waiting: 1, kvUsage: 0.25 }, 9, 4)?.counters).toEqual({})
    expect(progressReading({ running: undefined, waiting: undefined }, 9, 4)).toEqual({
      at: 9,
      counters: {},
      held: undefined,
      inflight: 4
    })
    expect(progressReading({ running: 1, waiting: undefined }, 9, 0)?.held).toBe(1)
    expect(progressReading(undefined, 9, 4)).toBeUndefined()
  })
})

describe("the stall state's progress source", () => {
  const np = { since: 20_000, held: 3, counters: [P, G] }

  it("no progress stalls the engine, with a reason naming the counters; a move or a completion clears it", () => {
    const s = onNoProgress(noStall, np)!
    expect(isStalled(s)).toBe(true)
    expect(stallStart(s)).toBe(20_000)
    expect(stallProblem(s, "5m")).toBe(
      "engine stalled: it made no progress for 5m (engine.stream_idle_timeout) with 3 request(s) held " +
        "(vllm:prompt_tokens_total and vllm:generation_tokens_total unchanged)"
    )
    const three = onNoProgress(noStall, { ...np, counters: ["a", "b", "c"] })!
    expect(stallProblem(three, "5m")).toMatch(/ \(a, b and c unchanged\)$/)
    expect(onNoProgress(s, { ...np, since: 30_000 }), "already so: no change").toBeUndefined()
    expect(isStalled(onProgress(s)!)).toBe(false)
    expect(onProgress(noStall), "nothing to clear: no change").toBeUndefined()
    expect(isStalled(onCompleted(s, 25_000)!)).toBe(false)
  })

  it("the restart is due stall_restart_after past the earlier of the two sources", () => {
    const s = onNoProgress(noStall, np)!
    expect(stallRestartAt(s, 60_000)).toBe(80_000)
    const both = onStall(s, 30_000)
    expect(stallRestartAt(both, 60_000)).toBe(80_000)
    expect(stallProblem(both, "5m")).toMatch(/^engine stalled: 1 stream\(s\) sent nothing/)
    // streams first, then the counters
    const later = onNoProgress(onStall(noStall, 1_000), np)!
    expect(stallStart(later)).toBe(1_000)
    // a counter move clears the counters' source only: the stalled stream still stands
    expect(isStalled(onProgress(later)!)).toBe(true)
    expect(stallRestartAt(onProgress(later)!, 60_000)).toBe(61_000)
  })
})
