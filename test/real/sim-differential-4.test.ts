// Differential check of the llama_cpp simulator against the real llama-server, continued (sim-differential.test.ts,
// -2 and -3 have the rest): slots. Each prompt of a request is a task of its own; a task holds a slot from its first
// token to its last, at most -np run at once across all requests, and the others wait in arrival order
// (tools/server/server-context.cpp process_single_task: get_available_slot, queue_tasks.defer; a released slot
// pops the first deferred task, server-queue.cpp pop_deferred_task). A task's begin (`data: null` in a stream) is
// sent as it takes its slot. What is compared is the order of what arrives: which choice's tokens, ends and begins
// come when, within one stream and across two. The order of tokens of tasks that run side by side is the
// engine's (llama-server's differs from step to step), so there only how many run at once is.
import { beforeAll, describe, expect, it } from "vitest"
import { pollUntil } from "../support/poll.ts"
import { postOnOwnConnection as post, requestOnOwnConnection as request } from "./engine.ts"
import { eventWord, type Pair, pairs, orderedShape as shape, streamCompletion } from "./simPair.ts"

const diff = pairs("cgn-real-diff4-")

/**
 * A real llama-server and the simulator on the same command line. The simulator takes 1 ms a token, so that a long
 * answer lasts while another request comes (the tiny model takes about as long on one thread).
 */
const pair = (np: number, args: ReadonlyArray<string> = []) =>
  diff.pair({ np, args, knobs: ["--sim-mode", "random", "--sim-itl", "1ms"] })

let one: Pair
let two: Pair
/** A pair of its own for /slots, which shows what each slot ran: fresh at its test. */
let fresh: Pair
/** With --metrics: a test that waits for a task to be deferred (llamacpp:requests_deferred). */
let counted: Pair

beforeAll(async () => {
  one = await pair(1)
  two = await pair(2)
  fresh = await pair(2)
  counted = await pair(2, ["--metrics"])
}, 30 * 60_000)

/**
 * Streams a completion (on a connection of its own), handing each event's word to `seen` as it arrives; resolves
 * with them all.
 */
const stream = async (base: string, body: Record<string, unknown>, seen: (e: string) => void = () => {}) => {
  const out: Array<string> = []
  await streamCompletion(base, body, (event) => {
    if (!event.startsWith("data: ")) return
    const e = eventWord(event.slice(6))
    out.push(e)
    seen(e)
  })
  return out
}

/** Runs of the same word as one: a choice's tokens as one word. */
const runs = (es: ReadonlyArray<string>) => es.filter((e, i) => e !== es[i - 1])

/** How many choices had begun and not yet ended at most, along a stream. */
const mostAtOnce = (es: ReadonlyArray<string>) => {
  const open = new Set<string>()
  let most = 0
  for (const e of es) {
    if (e.endsWith("F")) open.delete(e.slice(0, -1))
    else if (/^\d+$/.test(e)) open.add(e)
    most = Math.max(most, open.size)
  }
  return most
}

const THREE = { prompt: ["a b", "c d", "e f"], max_tokens: 8 }

describe("slots: a request's prompts and other requests, the simulator against the real server", () => {
  it("-np 1: a three-prompt stream is one task after the other, each but the first begun by `data: null`", async () => {
    const want = ["0", "0F", "null", "1", "1F", "null", "2", "2F", "DONE"]
    for (const base of one.bases) expect([base, runs(await stream(base, THREE))]).toEqual([base, want])
  })

  it("-np 2: two tasks of a three-prompt stream run at once, both begun before a token; the third once one ends", async () => {
    for (const base of two.bases) {
      const es = await stream(base, THREE)
      const firstEnd = es.findIndex((e) => e.endsWith("F"))
      const third = { begun: es.indexOf("null", firstEnd) < es.indexOf("2"), after: es.indexOf("2") > firstEnd }
      const got = { leading: es[0], nulls: es.filter((e) => e === "null").length, most: mostAtOnce(es), third }
      expect([base, got]).toEqual([base, { leading: "null", nulls: 2, most: 2, third: { begun: true, after: true } }])
    }
  })

  it("-np 2, one slot busy with a long stream: a three-prompt stream runs its tasks in the other, one by one", async () => {
    for (const base of two.bases) {
      const order: Array<string> = []
      let started: () => void = () => {}
      const longStarted = new Promise<void>((resolve) => {
        started = resolve
      })
      const long = stream(base, { prompt: "g h", max_tokens: 400 }, (e) => {
        order.push(`long:${e}`)
        started()
      })
      await longStarted
      const three = await stream(base, { ...THREE, max_tokens: 16 }, (e) => order.push(`three:${e}`))
      await long
      // the three tasks' runs, none begun before a token; all three done before the long one
      expect([base, runs(three)]).toEqual([base, ["0", "0F", "null", "1", "1F", "null", "2", "2F", "DONE"]])
      expect([base, order.indexOf("three:DONE") < order.indexOf("long:0F")]).toEqual([base, true])
    }
  })

  it("-np 2: a later request takes the slot the first two tasks of a whole three-prompt answer free, beside the third", async () => {
    for (const base of two.bases) {
      const order: Array<string> = []
      const whole = post(base, "/v1/completions", { ...THREE, max_tokens: 100 }).then((r) => {
        order.push("whole")
        return r.status
      })
      // the whole answer holds a slot (a bounded poll: it has no event to await)
      const busy = async () =>
        ((await (await fetch(`${base}/slots`)).json()) as Array<{ is_processing: boolean }>).some(
          (s) => s.is_processing
        )
      await pollUntil(`${base} /slots busy`, busy, 10_000, 5)
      const later = await stream(base, { prompt: "g h", max_tokens: 4 }, (e) => order.push(`later:${e}`))
      expect([base, await whole, runs(later)]).toEqual([base, 200, ["0", "0F", "DONE"]])
      // its first token came while the whole answer's third task was still generating
      expect([base, order.indexOf("later:0") < order.indexOf("whole")]).toEqual([base, true])
    }
  })
})

type Slot = {
  is_processing: boolean
  params?: { n_predict: number; stream: boolean }
  next_token?: Array<{ has_next_token: boolean; n_remain: number; n_decoded: number }>
  n_prompt_tokens_processed?: number
}
const slots = async (base: string) => JSON.parse((await request(`${base}/slots`)).text) as Array<Slot>

describe("slots: a prompt's n completions, the simulator against the real server", () => {
  it("-np 2, one slot busy: an n = 2 task waits for both slots, holding none, and a later task runs in the free one", async () => {
    for (const base of counted.bases) {
      const order: Array<string> = []
      const tagged = (tag: string) => (e: string) => {
        if (order.at(-1) !== `${tag}:${e}`) order.push(`${tag}:${e}`)
      }
      const long = stream(base, { prompt: "g h", max_tokens: 450 }, tagged("long"))
      await pollUntil(`${base} long's first token`, () => order.length > 0, 10_000, 2)
      const two = stream(base, { prompt: "a b", n: 2, max_tokens: 6 }, tagged("two"))
      const deferred = async () =>
        /^llamacpp:requests_deferred 1$/m.test((await request(`${base}/metrics`)).text) ? true : undefined
      await pollUntil(`${base} the n = 2 task deferred`, deferred, 10_000, 2)
      const later = await stream(base, { prompt: "c d", max_tokens: 4 }, tagged("later"))
      await Promise.all([long, two])
      const at = (e: string) => order.indexOf(e)
      const firstOfTwo = order.findIndex((e) => /^two:\d$/.test(e))
      expect([base, runs(later), at("later:DONE") < at("long:0F"), at("long:0F") < firstOfTwo]).toEqual([
        base,
        ["0", "0F", "DONE"],
        true,
        true
      ])
    }
  })
})

describe("/slots: the simulator against the real server", () => {
  it("fresh, busy, then idle: each slot's last task in the same keys, types and order, in the slot llama-server picks", async () => {
    for (const base of fresh.bases) {
      const before = await slots(base)
      // a fresh server's first task takes its last slot (get_available_slot's LRU, ties to the last)
      let first: () => void = () => {}
      const firstEvent = new Promise<void>((resolve) => {
        first = resolve
      })
      const long = stream(base, { prompt: "the quick", max_tokens: 300 }, () => first())
      await firstEvent
      const busy = await slots(base)
      await long
      const chat = { messages: [{ role: "user", content: "hi" }], max_tokens: 5 }
      expect((await post(base, "/v1/chat/completions", chat)).status).toBe(200)
      const idle = await slots(base)
      ;(base === fresh.real ? realSlots : simSlots).push(before, busy, idle)
      const [running, last] = [busy[1], idle[0]]
      const next = running?.next_token?.[0]
      expect([base, busy.map((x) => x.is_processing), running?.params?.n_predict, running?.params?.stream]).toEqual([
        base,
        [false, true],
        300,
        true
      ])
      expect([base, next?.has_next_token, (next?.n_remain ?? 0) + (next?.n_decoded ?? 0)]).toEqual([base, true, 300])
      // a slot's task once it ended: reset (server_slot::reset), its params kept
      const ended = { has_next_token: false, has_new_line: false, n_remain: -1, n_decoded: 0 }
      expect([base, last?.next_token?.[0], last?.n_prompt_tokens_processed, last?.params?.n_predict]).toEqual([
        base,
        ended,
        0,
        5
      ])
    }
    expect(simSlots.map(shape)).toEqual(realSlots.map(shape))
    // the params a chat's task ran with, value for value
    expect(simSlots[2]?.[0]?.params).toEqual(realSlots[2]?.[0]?.params)
  })
})
const realSlots: Array<Array<Slot>> = []
const simSlots: Array<Array<Slot>> = []
