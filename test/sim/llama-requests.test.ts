// The llama_cpp flavor's request reading and stop strings, as pure functions, and its SSE pings: the paths the
// differential test (test/real/sim-differential.test.ts) cannot reach on purpose, since which text a model
// makes is its own and a real server does not stall on demand. The rules are llama-server's (ggml-org/llama.cpp
// tools/server/server-schema.cpp, server-context.cpp process_token and handle_completions_impl,
// common/common.h string_find_partial_stop).
import { describe, expect, it } from "vitest"
import { llamaMessages } from "../../src/sim/llamaMessages.ts"
import { llamaPrompts } from "../../src/sim/llamaPrompts.ts"
import { llamaParams } from "../../src/sim/llamaRequest.ts"
import { type SeqEvent, sequenceEvents } from "../../src/sim/sequences.ts"
import type { Generation } from "../../src/sim/tokens.ts"
import { getJson, pollUntil, postJson, readUntilPing, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const gen = (tokens: Array<string>, finishReason: Generation["finishReason"] = "length"): Generation => ({
  tokens,
  finishReason
})
const sent = (evs: Array<SeqEvent>) => evs.filter((e) => e.kind === "token").map((e) => e.text)
const end = (evs: Array<SeqEvent>) => evs.find((e) => e.kind === "end")

describe("stop strings (llama-server's process_token)", () => {
  it("cut the text where the first stop begins, in the token that completes it, and end with stop", () => {
    const evs = [...sequenceEvents([gen([" hel", "lo wor", "ld"])], ["o w", "xyz"])]
    expect(sent(evs)).toEqual([" hel", "l"])
    expect(end(evs)).toMatchObject({ reason: "stop", content: " hell", generated: 2 })
    expect(evs.find((e) => e.kind === "token" && e.stopped)).toMatchObject({ index: 0, last: true })
  })

  it("hold back text that may start a stop string; a later token without it releases it", () => {
    const evs = [...sequenceEvents([gen([" ab", "c", "d", " e"])], ["cx"])]
    // " abc" ends with "c", the start of "cx": held; "d" shows it is not one.
    expect(sent(evs)).toEqual([" ab", "", "cd", " e"])
    expect(end(evs)).toMatchObject({ reason: "length", content: " abcd e" })
  })

  it("a held-back start is lost from the stream at max_tokens but kept in the whole answer; released at end of text", () => {
    const capped = [...sequenceEvents([gen([" ab", "c"], "length")], ["cx"])]
    expect(sent(capped)).toEqual([" ab", ""])
    expect(end(capped)).toMatchObject({ reason: "length", content: " abc" })
    const eos = [...sequenceEvents([gen([" ab", "c"], "stop")], ["cx"])]
    expect(sent(eos)).toEqual([" ab", "c"])
  })

  it('"" stops at once, with the first token cut to nothing', () => {
    const evs = [...sequenceEvents([gen([" a", " b"])], [""])]
    expect(sent(evs)).toEqual([""])
    expect(end(evs)).toMatchObject({ reason: "stop", content: "", generated: 1 })
  })

  it("several sequences take turns, each ending right after its last token", () => {
    const evs = [...sequenceEvents([gen([" a", " b"]), gen([" c"])], [])]
    expect(evs.map((e) => `${e.kind}${"index" in e ? e.index : ""}`)).toEqual([
      "token0",
      "token1",
      "end1",
      "token0",
      "end0"
    ])
  })
})

describe("request fields (llama-server's schema)", () => {
  it("reads aliases in order, truncates integers, takes booleans as numbers, clamps soft limits", () => {
    const p = llamaParams({ n_predict: 3, max_tokens: 9, n: 2.9, temperature: -5, top_k: -1, seed: -1 }, 4)
    expect(p).toMatchObject({ nPredict: 3, nCmpl: 2, seed: 4294967295 })
    expect(llamaParams({ max_tokens: true }, 4)).toMatchObject({ nPredict: 1 })
    expect(llamaParams({ max_tokens: null }, 4)).toMatchObject({ nPredict: -1 })
  })

  it("refuses a wrong type or a value past a hard limit, naming the field as sent", () => {
    expect(llamaParams({ max_completion_tokens: -2 }, 4)).toEqual({
      status: 400,
      message: "Field 'max_completion_tokens': Value must be between -1 <= value <= 2147483647, but got -2"
    })
    expect(llamaParams({ n: 5 }, 4)).toMatchObject({
      message: "Field 'n': Value must be between 1 <= value <= 4, but got 5"
    })
    expect(llamaParams({ adaptive_decay: 1 }, 4)).toMatchObject({
      message: "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, but got 1.000000"
    })
    expect(llamaParams({ cache_prompt: 1 }, 4)).toMatchObject({
      message: "Field 'cache_prompt': [json.exception.type_error.302] type must be boolean, but is number"
    })
    expect(llamaParams({ stop: ["a", [1]] }, 4)).toMatchObject({
      message: "Field 'stop': [json.exception.type_error.302] type must be string, but is array"
    })
    expect(llamaParams({ stop: ["a", null, {}, ""] }, 4)).toMatchObject({ stop: ["a", ""] })
    expect(llamaParams({ stop: 5 }, 4)).toMatchObject({ stop: [] })
  })

  it("prompts: strings, token ids, mixed, {prompt_string}; an array without ids is several", () => {
    // a text's tokens after the BOS, token ids' as they are
    expect(llamaPrompts({ prompt: "a b" })).toEqual([{ words: ["a", "b"], tokens: ["<s>", "a", "b"] }])
    expect(llamaPrompts({ prompt: [1, 2] })).toEqual([{ words: ["1", "2"], tokens: ["1", "2"] }])
    expect(llamaPrompts({ prompt: [1, "a b"] })).toEqual([{ words: ["1", "a", "b"], tokens: ["1", "a", "b"] }])
    expect(llamaPrompts({ prompt: ["a", [1], { prompt_string: "b" }] })).toHaveLength(3)
    expect(llamaPrompts({ prompt: [] })).toEqual({ status: 400, message: '"prompt" must not be empty' })
    expect(llamaPrompts({ prompt: [1, {}] })).toMatchObject({ status: 400 })
  })

  it("messages: counted as the template renders them with the BOS (as the real server counts them with the tiny model)", () => {
    const count = (body: Record<string, unknown>) => {
      const m = llamaMessages(body)
      return "tokens" in m ? m.tokens.length : m
    }
    const u = (content: string) => ({ role: "user", content })
    expect([
      count({ messages: [u("hi")] }),
      count({ messages: [{ role: "system", content: "be brief" }, u("hi")] }),
      count({ messages: [u("hi"), { role: "assistant", content: "hello" }, u("how are you")] }),
      count({ messages: [u("hi"), { role: "assistant", content: "hello" }] }),
      count({ messages: [u("hi")], add_generation_prompt: false }),
      count({ messages: [] })
    ]).toEqual([29, 48, 68, 30, 19, 11])
  })

  it("messages: an assistant message may go without content, two at the end may not", () => {
    // an empty assistant message is continued with nothing: the BOS alone (llamaTemplate.ts renderChat)
    expect(llamaMessages({ messages: [{ role: "assistant", tool_calls: [] }] })).toEqual({
      words: [],
      text: "",
      tokens: ["<s>"]
    })
    expect(llamaMessages({ messages: [{ role: "assistant" }] })).toEqual({
      status: 400,
      message: "Assistant message must contain either 'content' or 'tool_calls'!"
    })
    expect(llamaMessages({ messages: [{ role: "user", content: [{ type: "input_audio" }] }] })).toMatchObject({
      status: 500,
      message: expect.stringMatching(/^audio input is not supported/)
    })
  })
})

/** A stream's events (`data:` payloads) with the ms each arrived after the request. */
const timedEvents = async (url: string, body: Record<string, unknown>) => {
  const t0 = performance.now()
  const res = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ ...body, stream: true }) })
  const seen: Array<{ data: string; ms: number }> = []
  const decoder = new TextDecoder()
  let buf = ""
  for await (const chunk of res.body as ReadableStream<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true })
    for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
      seen.push({ data: buf.slice(6, i), ms: performance.now() - t0 })
      buf = buf.slice(i + 2)
    }
  }
  return seen
}

describe("a stream's finish", () => {
  // llama-server sends a task's final response in the update_slots pass of its last token (process_token, then
  // send_final_response): no decode step between them, for each of a step's tasks; vLLM sends the last token with
  // its finish reason, one step after the token before it. The simulator waited a step (its ITL) after each.
  it.each([
    ["llama_cpp", ["-m", simGguf("m.gguf"), "-np", "2"], { prompt: ["one two three", "four five six"] }],
    ["vllm", ["--model", "m"], { prompt: "one two three" }]
  ] as const)("%s: goes out with the last token, not a step after it", async (flavor, args, body) => {
    const sim = await startSim({ flavor, args: [...args, "--sim-itl", "600ms", "--sim-mode", "random"] })
    try {
      const seen = await timedEvents(sim.url, { model: "m", max_tokens: 3, ...body })
      expect(seen.filter((e) => /"finish_reason":"length"/.test(e.data)).length).toBe(
        Array.isArray(body.prompt) ? 2 : 1
      )
      // three tokens a task, two decode steps between them: [DONE] two steps after the first token, not three
      const took = (seen.at(-1)?.ms ?? 0) - (seen[0]?.ms ?? 0)
      expect(seen.at(-1)?.data).toBe("[DONE]")
      expect(took).toBeGreaterThanOrEqual(1.5 * 600)
      expect(took).toBeLessThan(2.5 * 600)
      // a whole answer takes its steps as the stream does: none after its last token
      const t0 = performance.now()
      const whole = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", max_tokens: 3, ...body })
      })
      expect(whole.status).toBe(200)
      await whole.text()
      expect(performance.now() - t0).toBeLessThan(2.5 * 600)
    } finally {
      await sim.stop()
    }
  })
})

describe("a request's later task (a second prompt)", () => {
  it("begins, `data: null`, as it takes its slot, and makes its first token its prompt's TTFT after", async () => {
    // llama-server sends a task's begin as update_slots starts its prompt, before decoding it (server-context.cpp,
    // SLOT_STATE_STARTED: send_partial_response with is_begin); the simulator sent it with the first token
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "-np", "1", "--sim-ttft", "400ms", "--sim-itl", "300ms", "--sim-mode", "random"]
    })
    try {
      const seen = await timedEvents(sim.url, { prompt: ["a b", "c d"], max_tokens: 2 })
      const begin = seen.findIndex((e) => e.data === "null")
      const first = seen.findIndex((e) => e.data.includes('"index":1'))
      const ended = seen.findIndex((e) => e.data.includes('"finish_reason":"length"'))
      // -np 1: choice 0 to its end, the second task's begin, then its tokens
      expect([ended < begin, begin + 1 === first]).toEqual([true, true])
      // out as the slot is taken (choice 0's end), the second prompt's 400 ms TTFT after it
      expect((seen[first]?.ms ?? 0) - (seen[begin]?.ms ?? 0)).toBeGreaterThanOrEqual(300)
      // that long, not a decode step (the ITL) more: the wait for its prompt stands for the step it starts in
      expect((seen[first]?.ms ?? 0) - (seen[begin]?.ms ?? 0)).toBeLessThan(400 + 150)
    } finally {
      await sim.stop()
    }
  })
})

describe("a stalled stream", () => {
  it("gets an SSE comment each --sse-ping-interval once its first chunk is out, until the client goes", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "--sse-ping-interval", "1", "--sim-stall-after-tokens", "1"]
    })
    try {
      const ac = new AbortController()
      const res = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "a b c", stream: true }),
        signal: ac.signal
      })
      const { text } = await readUntilPing(res)
      // One token, then the ping: a comment line, which SSE clients skip.
      expect(text).toMatch(/^data: \{.*"text":"a".*\}\n\n:\n\n$/s)
      ac.abort()
      await pollUntil(async () => ((await getJson(`${sim.url}/sim/state`)).json as { running: number }).running === 0)
    } finally {
      await sim.stop()
    }
  })
})

// llama-server keeps a request whose client left while it waited for a slot: it stays deferred, takes the slot when
// one frees, and its prompt is evaluated for nobody; a stream is dropped at its first token, a whole answer generated
// to its end (ggml-org/llama.cpp#13262; the real server measured so). The
// simulator dropped it at once, so nothing built on it could see what such a cancel costs.
/** A series' value on the simulator's /metrics. */
const metricOf = async (url: string, name: string): Promise<number> => {
  const page = await (await fetch(`${url}/metrics`)).text()
  return Number(
    page
      .split("\n")
      .find((l) => l.startsWith(`${name} `))
      ?.split(" ")[1]
  )
}

/**
 * The only slot held ~2 s by a holder echoing 100 words at 20 ms (3 words held it 60 ms, which a loaded machine
 * overran), and a streamed request deferred behind it, which `leave()` cancels.
 */
const deferredBehindHolder = async (sim: SimHandle, prompt: string) => {
  const metric = (name: string) => metricOf(sim.url, name)
  const words = Array.from({ length: 100 }, (_, i) => `w${i}`).join(" ")
  const holder = fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ prompt: words, max_tokens: 100, stream: true })
  }).then((r) => r.text())
  await pollUntil(async () => ((await metric("llamacpp:requests_processing")) === 1 ? true : undefined))
  const ac = new AbortController()
  const left = fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ prompt, max_tokens: 4, stream: true }),
    signal: ac.signal
  }).catch(() => undefined)
  await pollUntil(async () => ((await metric("llamacpp:requests_deferred")) === 1 ? true : undefined))
  return {
    holder,
    leave: async () => {
      ac.abort()
      await left
    }
  }
}

describe("a request left while it waited for a slot", () => {
  it("stays deferred until the slot frees, then has its prompt evaluated and is dropped", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "-np", "1", "--metrics", "--sim-itl", "20ms"]
    })
    const metric = (name: string) => metricOf(sim.url, name)
    try {
      const { holder, leave } = await deferredBehindHolder(sim, "one two three four five")
      const promptBefore = await metric("llamacpp:prompt_tokens_total")
      const predictedBefore = await metric("llamacpp:tokens_predicted_total")
      await leave()
      // still deferred while the slot is busy (it was 0 at once)
      expect(await metric("llamacpp:requests_deferred")).toBe(1)
      await holder
      // the slot freed: the left request took it, its five prompt tokens and the BOS evaluated (the real server
      // counts 6: test/real/sim-differential.test.ts), and it is gone
      await pollUntil(async () =>
        (await metric("llamacpp:requests_deferred")) === 0 && (await metric("llamacpp:requests_processing")) === 0
          ? true
          : undefined
      )
      expect((await metric("llamacpp:prompt_tokens_total")) - promptBefore).toBe(6)
      // its first token made and counted, besides the holder's 100 (counted as its task ends)
      expect((await metric("llamacpp:tokens_predicted_total")) - predictedBefore).toBe(101)
    } finally {
      await sim.stop()
    }
  })

  // ggml-org/llama.cpp#13262: the left request takes the freed slot and has its prompt evaluated (the TTFT) there
  // before it is dropped; the next waiter waits for that.
  it("holds the freed slot for its prompt's TTFT, the next waiter behind it", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "-np", "1", "--metrics", "--sim-ttft", "600ms", "--sim-itl", "20ms"]
    })
    const deferred = () => metricOf(sim.url, "llamacpp:requests_deferred")
    try {
      const { holder, leave } = await deferredBehindHolder(sim, "one two three")
      const next = postJson(`${sim.url}/v1/completions`, { prompt: "x", max_tokens: 1 })
      await pollUntil(async () => ((await deferred()) === 2 ? true : undefined))
      await leave()
      // Once the holder is done the left request holds the slot for 600 ms while `next` still waits; dropped at
      // once, the slot would pass straight to `next` (deferred 2, then 0).
      await pollUntil(async () => ((await deferred()) === 1 ? true : undefined))
      expect(await metricOf(sim.url, "llamacpp:requests_processing")).toBe(1)
      expect((await next).status).toBe(200)
      await holder
    } finally {
      await sim.stop()
    }
  })

  it("a whole answer left while its prompt is processed (in its slot, before its first token) is generated to its end too", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: [
        "-m",
        simGguf("m.gguf"),
        "-np",
        "1",
        "--metrics",
        "--sim-ttft",
        "300ms",
        "--sim-itl",
        "2ms",
        "--sim-mode",
        "random"
      ]
    })
    const metric = (name: string) => metricOf(sim.url, name)
    try {
      const before = await metric("llamacpp:tokens_predicted_total")
      const ac = new AbortController()
      const left = fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "one two three", max_tokens: 20 }),
        signal: ac.signal
      }).catch(() => undefined)
      await pollUntil(async () => ((await metric("llamacpp:requests_processing")) === 1 ? true : undefined))
      ac.abort()
      await left
      await pollUntil(async () =>
        (await metric("llamacpp:tokens_predicted_total")) - before === 20 ? true : undefined
      )
      expect(await metric("llamacpp:requests_processing")).toBe(0)
    } finally {
      await sim.stop()
    }
  })

  it("a whole (non-streamed) answer left in the queue is generated to its end once it has the slot", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "-np", "1", "--metrics", "--sim-itl", "5ms", "--sim-mode", "random"]
    })
    const metric = (name: string) => metricOf(sim.url, name)
    try {
      const before = await metric("llamacpp:tokens_predicted_total")
      const holder = fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "a b c", max_tokens: 20, stream: true })
      }).then((r) => r.text())
      await pollUntil(async () => ((await metric("llamacpp:requests_processing")) === 1 ? true : undefined))
      const ac = new AbortController()
      const left = fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ prompt: "one two three", max_tokens: 30 }),
        signal: ac.signal
      }).catch(() => undefined)
      await pollUntil(async () => ((await metric("llamacpp:requests_deferred")) === 1 ? true : undefined))
      ac.abort()
      await left
      await holder
      // the left request took the slot and made all 30 tokens for nobody, then freed it
      await pollUntil(async () =>
        (await metric("llamacpp:tokens_predicted_total")) - before === 50 ? true : undefined
      )
      expect(await metric("llamacpp:requests_processing")).toBe(0)
    } finally {
      await sim.stop()
    }
  })
})
