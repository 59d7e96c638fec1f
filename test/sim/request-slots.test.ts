// The slots a request's sequences take (src/sim/requestSlots.ts) on an engine core's Scheduler: llama-server's
// tasks (a prompt with its `n` completions) one slot per sequence, from the first token to the last, in arrival
// order across requests; other engines' requests whole, as before.
import { describe, expect, it } from "vitest"
import { SlotBook } from "../../src/sim/llamaSlots.ts"
import { RequestSlots } from "../../src/sim/requestSlots.ts"
import { Scheduler } from "../../src/sim/scheduler.ts"
import { type SeqEvent, sequenceEvents } from "../../src/sim/sequences.ts"

const gen = (n: number) => ({ tokens: Array.from({ length: n }, (_, i) => ` w${i}`), finishReason: "length" as const })

/** A request of `n` sequences, its tasks beginning at 0 and `begins`, on scheduler `s` of `np` slots. */
const slotsOf = (flavor: "llama_cpp" | "vllm", s: Scheduler, n: number, begins: Array<number>, np: number) => {
  const q = { words: ["a"], promptTokens: 2, maxTokens: 4, seed: undefined }
  const llama = { nProbs: 0, postSamplingProbs: false, timingsPerToken: false, begins, slots: np, nPredict: 4 }
  const gr = { endpoint: "completion" as const, sequences: Array(n).fill(q), stream: true, ignoreEos: false, llama }
  return new RequestSlots({ flavor, maxSeqs: np }, { scheduler: s, slotBook: new SlotBook() }, gr)
}

/** Runs a request's events to their end, awaiting each `wait`; the events as words (t0, e0, wait). */
const run = async (events: Generator<SeqEvent>) => {
  const out: Array<string> = []
  for (const ev of events) {
    if (ev.kind === "wait") await ev.until
    out.push(ev.kind === "wait" ? "wait" : `${ev.kind[0]}${ev.index}`)
  }
  return out
}

describe("RequestSlots", () => {
  it("llama_cpp, one slot: each prompt's task in turn, the slot handed on at its end", async () => {
    const s = new Scheduler(1)
    const slots = slotsOf("llama_cpp", s, 2, [1], 1)
    await slots.first
    expect(await run(sequenceEvents([gen(2), gen(1)], [], slots))).toEqual(["t0", "t0", "e0", "t1", "e1"])
    slots.release()
    expect([s.running, s.waiting]).toEqual([0, 0])
  })

  it("llama_cpp: a later request's task waits behind this one's, and starts as this one's first task ends", async () => {
    const s = new Scheduler(2)
    const a = slotsOf("llama_cpp", s, 3, [1, 2], 2)
    const b = slotsOf("llama_cpp", s, 1, [], 2)
    expect([s.running, s.waiting, a.holding()]).toEqual([2, 2, 2])
    const events = sequenceEvents([gen(1), gen(2), gen(1)], [], a)
    expect([...Array(3)].map(() => events.next().value?.kind)).toEqual(["token", "end", "token"])
    // a's third task is ahead of b in the queue: it takes the slot its first task freed
    expect([a.holds(2), b.holds(0)]).toEqual([true, false])
    a.release()
    expect([b.holds(0), s.running]).toEqual([true, 1])
  })

  it("llama_cpp: a prompt's `n` completions are launched together and each frees its slot at its own end", async () => {
    const s = new Scheduler(2)
    const a = slotsOf("llama_cpp", s, 4, [2], 2)
    await a.first
    expect(await run(sequenceEvents([gen(1), gen(2), gen(1), gen(1)], [], a))).toEqual([
      ...["t0", "e0", "t1", "t1", "e1"],
      ...["t2", "e2", "t3", "e3"]
    ])
    expect(s.running).toBe(0)
  })

  it("other engines: min(sequences, maxSeqs) slots for the whole request, its sequences never waiting", async () => {
    const s = new Scheduler(1)
    const a = slotsOf("vllm", s, 2, [], 1)
    await a.first
    expect(await run(sequenceEvents([gen(1), gen(1)], [], a))).toEqual(["t0", "e0", "t1", "e1"])
    expect(s.running).toBe(1)
    a.release()
    expect(s.running).toBe(0)
  })
})
