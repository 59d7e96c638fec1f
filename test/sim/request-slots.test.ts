// The slots a request's sequences take (src/sim/requestSlots.ts) on an engine core's Scheduler: llama-server's
// tasks (a prompt with its `n` completions) one slot per sequence, from the first token to the last, in arrival
// order across requests; other engines' requests whole, as before.
import { describe, expect, it, vi } from "vitest"
import { SlotBook } from "../../src/sim/llamaSlots.ts"
import { RequestSlots } from "../../src/sim/requestSlots.ts"
import { Scheduler } from "../../src/sim/scheduler.ts"
import { type SeqEvent, sequenceEvents } from "../../src/sim/sequences.ts"

const gen = (n: number) => ({ tokens: Array.from({ length: n }, (_, i) => ` w${i}`), finishReason: "length" as const })

/** A request of `n` sequences, its tasks beginning at 0 and `begins`, on scheduler `s` of `np` slots. */
const slotsOf = (
  flavor: "llama_cpp" | "vllm",
  s: Scheduler,
  n: number,
  begins: Array<number>,
  np: number,
  o: { words?: Array<string>; ttftMs?: number; book?: SlotBook } = {}
) => {
  const words = o.words ?? ["a"]
  const q = { words, tokens: ["<s>", ...words], promptTokens: words.length + 1, maxTokens: 4, seed: undefined }
  const llama = { nProbs: 0, postSamplingProbs: false, timingsPerToken: false, begins, slots: np, nPredict: 4 }
  const gr = { endpoint: "completion" as const, sequences: Array(n).fill(q), stream: true, ignoreEos: false, llama }
  const cfg = { flavor, maxSeqs: np, ttftMs: o.ttftMs ?? 0 }
  return new RequestSlots(cfg, { scheduler: s, slotBook: o.book ?? new SlotBook() }, gr)
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
    // the second task begins as it takes the slot, before its first token
    expect(await run(sequenceEvents([gen(2), gen(1)], [], slots))).toEqual(["t0", "t0", "e0", "b1", "t1", "e1"])
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
      ...["b2", "b3", "t2", "e2", "t3", "e3"]
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

  it("llama_cpp: one decode step gives each running sequence a token, its last token ending the step", async () => {
    const s = new Scheduler(2)
    const a = slotsOf("llama_cpp", s, 2, [], 2)
    await a.first
    const steps = [...sequenceEvents([gen(2), gen(2)], [], a)].flatMap((e) => (e.kind === "token" ? [e.stepEnd] : []))
    expect(steps).toEqual([false, true, false, true])
  })

  it("llama_cpp: a later task begins as it takes its slot and makes no token until its prompt's TTFT after", async () => {
    const s = new Scheduler(1)
    const a = slotsOf("llama_cpp", s, 2, [1], 1, { ttftMs: 40 })
    await a.first
    const events = sequenceEvents([gen(1), gen(1)], [], a)
    // its begin at once (update_slots sends it before evaluating the prompt), then the wait for its prompt
    expect([...Array(3)].map(() => events.next().value)).toMatchObject([
      { kind: "token" },
      { kind: "end" },
      { kind: "begin", index: 1 }
    ])
    const wait = events.next().value
    // the second task holds the slot the first freed, its prompt not yet evaluated
    expect([wait?.kind, s.running, a.holds(1)]).toEqual(["wait", 1, false])
    const t0 = performance.now()
    if (wait?.kind === "wait") await wait.until
    expect([a.holds(1), performance.now() - t0 >= 30]).toEqual([true, true])
    a.release()
  })

  it("llama_cpp: a request released while a later task's prompt is evaluated keeps no timer", async () => {
    vi.useFakeTimers()
    try {
      const s = new Scheduler(1)
      const a = slotsOf("llama_cpp", s, 2, [1], 1, { ttftMs: 60_000 })
      await a.first
      const events = sequenceEvents([gen(1), gen(1)], [], a)
      expect([...Array(3)].map(() => events.next().value?.kind)).toEqual(["token", "end", "begin"])
      expect(vi.getTimerCount()).toBe(1)
      a.release()
      expect([vi.getTimerCount(), s.running]).toEqual([0, 0])
    } finally {
      vi.useRealTimers()
    }
  })

  it("llama_cpp: a task takes the idle slot its prompt shares enough of, else the LRU one; ids as posted", async () => {
    const s = new Scheduler(2)
    const book = new SlotBook()
    const run1 = (words: Array<string>, n = 1) => {
      const r = slotsOf("llama_cpp", s, n, [], 2, { words, book })
      for (const ev of sequenceEvents(Array(n).fill(gen(1)), [], r)) void ev
      r.release()
      return [0, 1].map((id) => book.toJson(id, 512, false).id_task)
    }
    const long = Array.from({ length: 20 }, (_, i) => `w${i}`)
    // a fresh server's last slot; the same prompt again (LRU would take slot 0); 1/21 in common: LRU (slot 0).
    // Each request takes an id and its one decode step another.
    expect([run1(["a", "b"]), run1(["a", "b"]), run1(long)]).toEqual([
      [undefined, 0],
      [undefined, 2],
      [4, 2]
    ])
    // n = 2: the parent in the similar slot (0), its child in the other; the child keeps no tokens
    expect(run1(long, 2)).toEqual([6, 7])
    expect(book.toJson(1, 512, false).n_prompt_tokens).toBe(0)
    // another task's id (/slots); an empty slot is never similar: 1/2 in common with slot 0
    book.taskId()
    expect(run1(["a"])).toEqual([10, 7])
  })

  it("llama_cpp: a task's children take the lowest idle slots, its parent the LRU one (get_free_slots)", async () => {
    const s = new Scheduler(3)
    const book = new SlotBook()
    const a = slotsOf("llama_cpp", s, 2, [], 3, { book })
    await a.first
    // tools/server/server-context.cpp: the parent by get_available_slot (a fresh server's last), the child by
    // get_free_slots (the first idle one by id, the parent's left out)
    expect([0, 1, 2].map((id) => book.toJson(id, 512, true).id_task)).toEqual([1, undefined, 0])
    a.release()
  })
})
