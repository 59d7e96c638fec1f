// The incremental SSE parser: table tests of the framing rules, then a seeded property test that any split
// of a random event stream (bytes or text, LF/CR/CRLF endings, comments, multi-line data) gives the same events.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { makeSseParser, parseSse, type SseEvent, SseEventTooLarge } from "../../src/services/engine/Sse.ts"
import { type Agent, collect, startAgent } from "../support/grpcAgent.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const feedAll = (pieces: ReadonlyArray<Uint8Array | string>): Array<SseEvent> => {
  const p = makeSseParser()
  const out: Array<SseEvent> = []
  for (const piece of pieces) out.push(...p.feed(piece))
  out.push(...p.end())
  return out
}

describe("SSE framing", () => {
  const cases: ReadonlyArray<[string, string, ReadonlyArray<SseEvent>]> = [
    ["one event", 'data: {"a":1}\n\n', [{ data: '{"a":1}' }]],
    ["two events in one chunk", "data: a\n\ndata: b\n\n", [{ data: "a" }, { data: "b" }]],
    ["no space after colon", "data:x\n\n", [{ data: "x" }]],
    ["only the first space is removed", "data:  x\n\n", [{ data: " x" }]],
    ["multi-line data joined with LF", "data: a\ndata: b\n\n", [{ data: "a\nb" }]],
    ["CRLF endings", "data: a\r\n\r\ndata: b\r\n\r\n", [{ data: "a" }, { data: "b" }]],
    ["CR endings", "data: a\r\rdata: b\r\r", [{ data: "a" }, { data: "b" }]],
    ["comment lines ignored (mlx keepalive)", ": keepalive 10/100\n\ndata: a\n\n", [{ data: "a" }]],
    ["event and id fields", "event: delta\nid: 7\ndata: a\n\n", [{ data: "a", event: "delta", id: "7" }]],
    [
      "id persists to later events",
      "id: 7\ndata: a\n\ndata: b\n\n",
      [
        { data: "a", id: "7" },
        { data: "b", id: "7" }
      ]
    ],
    // WHATWG: an id field whose value holds U+0000 NULL is ignored; the last id stays
    [
      "an id with NUL is ignored",
      "id: 7\ndata: a\n\nid: x\u0000y\ndata: b\n\n",
      [
        { data: "a", id: "7" },
        { data: "b", id: "7" }
      ]
    ],
    ["event without data is not dispatched", "event: ping\n\ndata: a\n\n", [{ data: "a" }]],
    ["retry and unknown fields ignored", "retry: 100\nfoo: bar\ndata: a\n\n", [{ data: "a" }]],
    ["field without colon", "data\n\n", [{ data: "" }]],
    ["[DONE] is data like any other", "data: [DONE]\n\n", [{ data: "[DONE]" }]],
    ["last event without blank line is kept at end", "data: a\n\ndata: [DONE]", [{ data: "a" }, { data: "[DONE]" }]],
    ["leading BOM dropped", "\uFEFFdata: a\n\n", [{ data: "a" }]],
    ["blank lines alone dispatch nothing", "\n\n\n", []],
    ["colon inside data kept", 'data: {"k":"v: w"}\n\n', [{ data: '{"k":"v: w"}' }]],
    // Older llama.cpp: `error: {...}` then `data: [DONE]`. Dropping the field would leave only [DONE].
    [
      "an error field line is kept (older llama.cpp)",
      'error: {"code":500,"message":"boom","type":"server_error"}\n\ndata: [DONE]\n\n',
      [{ data: "", error: '{"code":500,"message":"boom","type":"server_error"}' }, { data: "[DONE]" }]
    ],
    ["an error field beside data", "data: a\nerror: e\n\n", [{ data: "a", error: "e" }]],
    ["event: error is dispatched like any event", "event: error\ndata: x\n\n", [{ data: "x", event: "error" }]]
  ]
  for (const [name, input, expected] of cases) {
    it(name, () => {
      expect(parseSse(input)).toEqual(expected)
    })
  }

  it("CR at the end of one chunk and LF at the start of the next is one line break", () => {
    expect(feedAll(["data: a\r", "\n\r", "\n"])).toEqual([{ data: "a" }])
  })

  it("a multi-byte character split between chunks", () => {
    const bytes = new TextEncoder().encode("data: héllo €\n\n")
    const at = bytes.indexOf(0xe2) + 1 // inside the euro sign
    expect(feedAll([bytes.subarray(0, at), bytes.subarray(at)])).toEqual([{ data: "héllo €" }])
  })

  it("an event past the limit throws SseEventTooLarge: an unfinished line, data lines, error lines", () => {
    const p = makeSseParser(100)
    expect(p.feed(`data: ${"x".repeat(90)}\n\n`)).toHaveLength(1)
    expect(p.feed(`data: ${"x".repeat(60)}`)).toEqual([])
    expect(() => p.feed("y".repeat(60))).toThrow(SseEventTooLarge)
    const lines = makeSseParser(100)
    expect(() => lines.feed(`data: ${"x".repeat(40)}\ndata: ${"x".repeat(40)}\ndata: ${"x".repeat(40)}\n`)).toThrow(
      "SSE event over 100 bytes"
    )
    const errors = makeSseParser(100)
    expect(() => errors.feed(`error: ${"e".repeat(60)}\nerror: ${"e".repeat(60)}\n`)).toThrow(SseEventTooLarge)
    // The data lines joined (their line breaks counted): exactly the limit holds, one character more throws.
    expect(makeSseParser(100).feed(`data: ${"x".repeat(50)}\ndata: ${"x".repeat(49)}\n\n`)).toEqual([
      { data: `${"x".repeat(50)}\n${"x".repeat(49)}` }
    ])
    expect(() => makeSseParser(100).feed(`data: ${"x".repeat(50)}\ndata: ${"x".repeat(50)}\n`)).toThrow(
      SseEventTooLarge
    )
    // Without a limit: as before.
    expect(makeSseParser().feed(`data: ${"x".repeat(10_000)}`)).toEqual([])
  })

  it("events come out as soon as their blank line arrives", () => {
    const p = makeSseParser()
    expect(p.feed("data: a\n")).toEqual([])
    expect(p.feed("\nda")).toEqual([{ data: "a" }])
    expect(p.feed("ta: b\n\n")).toEqual([{ data: "b" }])
    expect(p.end()).toEqual([])
  })
})

// mulberry32: a tiny seeded PRNG, so a failing case can be replayed from its seed.
const prng = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = seed
  t = Math.imul(t ^ (t >>> 15), t | 1)
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

const pick = <A>(r: () => number, xs: ReadonlyArray<A>): A => xs[Math.floor(r() * xs.length)] as A

const randomText = (r: () => number): string => {
  const alphabet = ["a", "b", " ", ":", "{", '"', "é", "€", "😀", "[DONE]", "\\n"]
  let s = ""
  const n = Math.floor(r() * 12)
  for (let i = 0; i < n; i++) s += pick(r, alphabet)
  return s
}

/** A random stream and the events it must give. */
const randomStream = (r: () => number): { text: string; events: Array<SseEvent> } => {
  const eol = pick(r, ["\n", "\r\n", "\r"])
  const events: Array<SseEvent> = []
  let text = ""
  let id: string | undefined
  const n = 1 + Math.floor(r() * 8)
  for (let i = 0; i < n; i++) {
    if (r() < 0.3) text += `: comment ${randomText(r)}${eol}`
    let event: string | undefined
    if (r() < 0.2) {
      event = `e${i}`
      text += `event: ${event}${eol}`
    }
    if (r() < 0.2) {
      id = `${i}`
      text += `id:${id}${eol}`
    }
    const lines = 1 + Math.floor(r() * 3)
    const data: Array<string> = []
    for (let j = 0; j < lines; j++) {
      // A value starting with a space keeps all but the separator space.
      const v = randomText(r).replace(/^ +/, "")
      data.push(v)
      text += r() < 0.5 ? `data: ${v}${eol}` : `data:${v}${eol}`
    }
    text += eol
    const ev: { data: string; event?: string; id?: string } = { data: data.join("\n") }
    if (event !== undefined) ev.event = event
    if (id !== undefined) ev.id = id
    events.push(ev)
  }
  return { text, events }
}

const randomSplit = (r: () => number, bytes: Uint8Array): Array<Uint8Array> => {
  const pieces: Array<Uint8Array> = []
  let pos = 0
  while (pos < bytes.length) {
    const len = r() < 0.5 ? 1 + Math.floor(r() * 3) : 1 + Math.floor(r() * 40)
    pieces.push(bytes.subarray(pos, pos + len))
    pos += len
  }
  return pieces
}

describe("SSE property: any split gives the same events", () => {
  it("500 seeded streams, each split 5 ways as bytes and as text", () => {
    let checked = 0
    for (let seed = 1; seed <= 500; seed++) {
      const r = prng(seed)
      const { text, events } = randomStream(r)
      const bytes = new TextEncoder().encode(text)
      expect(parseSse(text), `seed ${seed} whole`).toEqual(events)
      for (let k = 0; k < 5; k++) {
        const pieces = randomSplit(r, bytes)
        expect(feedAll(pieces), `seed ${seed} split ${k}`).toEqual(events)
        // Text pieces split anywhere in UTF-16 code units (a surrogate pair may be split too, in bytes it is not).
        const cut = Math.floor(r() * text.length)
        expect(feedAll([text.slice(0, cut), text.slice(cut)]), `seed ${seed} text cut ${cut}`).toEqual(events)
        checked++
      }
    }
    expect(checked).toBe(2500)
  })
})

// Through the agent: a llama.cpp simulator fails a stream in the current form (`data: {"error":...}`, no
// [DONE]) and in the older one (`error: {...}` then `data: [DONE]`); either ends Generate with an error status
// carrying the engine's message, never as a short successful answer.
describe("SSE error events end Generate with an error status", () => {
  let sim: SimHandle
  let agent: Agent
  beforeAll(async () => {
    sim = await startSim({ args: ["-m", simGguf("tiny.gguf"), "-np", "2", "--sim-mode", "echo"] })
    agent = await startAgent(sim.url, "llama_cpp", { role: "both" })
  })
  afterAll(async () => {
    await agent?.close()
    await sim?.stop()
  })

  it.each(["sse_error_field", "midstream"])("llama.cpp %s", async (errorKind) => {
    expect((await postJson(`${sim.url}/sim/faults`, { errorRate: 1, errorKind })).status).toBe(200)
    try {
      const r = await collect(agent.client, { prompt: "one two three four", sampling: { maxTokens: 8, stop: [] } })
      expect(r.status).not.toBe("OK")
      expect(r.final).toBeUndefined()
      expect(r.details).toContain("simulated mid-stream engine failure")
      expect(r.trailer?.get("cgn-engine-reason")).toBe("Stream")
    } finally {
      await postJson(`${sim.url}/sim/faults`, { errorRate: 0 })
    }
  })
})
