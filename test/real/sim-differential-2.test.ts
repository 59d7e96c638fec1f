// Differential check of the llama_cpp simulator against the real llama-server, continued (sim-differential.test.ts
// has the first part): a slot's context as llama.cpp pads, splits and caps it, /props, /slots, /tokenize,
// /detokenize and /apply-template, a multi-prompt stream's `data: null` task begins, invalid token ids, logprobs
// and per-token timings. Shapes (keys, types, order), statuses and error bodies are compared; values only where
// they are not the model's (a token's logprob is, so only its range is checked).
import * as fs from "node:fs"
import * as path from "node:path"
import { beforeAll, describe, expect, it } from "vitest"
import { writeTinyLlama } from "../support/ggufModel.ts"
import { postOnOwnConnection as post, requestOnOwnConnection as request } from "./engine.ts"
import { type Pair, pairs, orderedShape as shape } from "./simPair.ts"

const diff = pairs("cgn-real-diff2-")
let main: Pair

beforeAll(async () => {
  main = await diff.pair({ args: ["--metrics"] })
}, 30 * 60_000)

const getJson = async (base: string, p: string) =>
  JSON.parse((await request(`${base}${p}`)).text) as Record<string, unknown>

/** A stream's events: `data: null` as null, [DONE] as the string, the rest parsed. */
const events = (text: string): Array<unknown> =>
  text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => {
      const d = e.slice(6)
      return d === "[DONE]" ? d : (JSON.parse(d) as unknown)
    })

describe("a slot's context: -c padded to 256, split over -np and padded again, capped at the model's training context", () => {
  const cases: Array<[string, Array<string>, number, number]> = [
    ["-c 1000 -np 3 (1024 padded, 341 per slot padded to 512)", ["-c", "1000", "-np", "3"], 2048, 512],
    ["-c 1024 -np 2 on a model trained for 300 (capped)", ["-c", "1024", "-np", "2"], 300, 300],
    ["-c 5000 -np 2 (2560 per slot, capped at 2048)", ["-c", "5000", "-np", "2"], 2048, 2048],
    ["no -c: the training context, 4 unified slots", [], 300, 300],
    ["no -c, -np 3: each slot the whole training context", ["-np", "3"], 2048, 2048],
    ["-c 0, -np 2 on a model trained for 300: each slot 300", ["-c", "0", "-np", "2"], 300, 300]
  ]
  for (const [name, extra, train, want] of cases) {
    it(name, async () => {
      const model = path.join(diff.dir, `tiny-${train}.gguf`)
      if (!fs.existsSync(model)) writeTinyLlama(diff.engine.vocab, model, "words", train)
      // the case's own -c and -np
      const p = await diff.pair({ model, ctx: null, np: null, args: ["--metrics", ...extra] })
      for (const base of [p.real, p.sim]) {
        const props = (await getJson(base, "/props")) as { default_generation_settings: { n_ctx: number } }
        expect([base, props.default_generation_settings.n_ctx]).toEqual([base, want])
        const slots = JSON.parse((await request(`${base}/slots`)).text) as Array<{ n_ctx: number }>
        expect(slots.map((s) => s.n_ctx)).toEqual(slots.map(() => want))
        const models = (await getJson(base, "/v1/models")) as { data: Array<{ meta: Record<string, number> }> }
        expect([base, models.data[0]?.meta.n_ctx, models.data[0]?.meta.n_ctx_train]).toEqual([base, want, train])
        // a prompt of the slot's whole context (with its BOS) is refused with the slot's size
        const r = await post(base, "/v1/completions", { prompt: Array.from({ length: want }, () => "hello").join(" ") })
        expect([base, r.status, JSON.parse(r.text).error.n_ctx]).toEqual([base, 400, want])
      }
    })
  }
})

describe("llama-server's informational routes: the simulator against the real server", () => {
  it("/props: every key in the real order with its type; /slots' leading keys", async () => {
    const [r, s] = [await getJson(main.real, "/props"), await getJson(main.sim, "/props")]
    expect(shape(s)).toEqual(shape(r))
    expect([s.total_slots, s.model_alias, s.model_path, s.is_sleeping]).toEqual([
      r.total_slots,
      r.model_alias,
      r.model_path,
      r.is_sleeping
    ])
  })

  it("/tokenize, /detokenize, /apply-template: statuses and shapes, refusals word for word", async () => {
    const cases: Array<[string, unknown]> = [
      ["/tokenize", { content: "hello world" }],
      ["/tokenize", { content: "hello world", add_special: true, with_pieces: true }],
      ["/tokenize", {}],
      ["/tokenize", { content: [1, "a b"] }],
      ["/tokenize", { content: 5 }],
      ["/detokenize", { tokens: [1, 2] }],
      ["/detokenize", {}],
      ["/detokenize", { tokens: "x" }],
      ["/detokenize", { tokens: [99999999] }],
      ["/detokenize", { tokens: [-1] }],
      ["/apply-template", { messages: [{ role: "user", content: "hi" }] }],
      ["/apply-template", {}],
      ["/apply-template", { messages: "hi" }]
    ]
    for (const [p, body] of cases) {
      const [r, s] = [await post(main.real, p, body), await post(main.sim, p, body)]
      expect([p, body, s.status, shape(JSON.parse(s.text))]).toEqual([p, body, r.status, shape(JSON.parse(r.text))])
      if (r.status !== 200) expect([p, body, s.text]).toEqual([p, body, r.text])
    }
    // the same tokens back, the BOS as <s>; a chat rendered with its generation prompt
    for (const base of [main.real, main.sim]) {
      const toks = JSON.parse(
        (await post(base, "/tokenize", { content: "hello world", add_special: true })).text
      ).tokens
      const back = JSON.parse((await post(base, "/detokenize", { tokens: toks })).text).content
      expect([base, back]).toEqual([base, "<s> hello world"])
      const t = await post(base, "/apply-template", { messages: [{ role: "user", content: "hi" }] })
      expect(JSON.parse(t.text).prompt).toMatch(/hi[\s\S]*assistant/)
    }
  })
})

describe("a chat's prompt: its template rendered, then counted, the simulator against the real server", () => {
  // words the tiny model's tokenizer keeps whole, so that only the template's rule is compared
  const u = (content: unknown) => ({ role: "user", content })
  const chats: Array<Record<string, unknown>> = [
    { messages: [u("hi")] },
    { messages: [u("hello world")] },
    { messages: [{ role: "system", content: "be brief" }, u("hi")] },
    { messages: [u("hi"), { role: "assistant", content: "hello" }, u("how are you")] },
    { messages: [{ role: "tool", content: "x" }] },
    { messages: [u("")] },
    { messages: [u("a\nb")] },
    {
      messages: [
        u([
          { type: "text", text: "a b" },
          { type: "text", text: "c" }
        ])
      ]
    },
    { messages: [u("hi"), { role: "assistant", content: "hello" }] },
    { messages: [u("hi"), { role: "assistant", content: "" }] },
    { messages: [u("hi")], add_generation_prompt: false },
    { messages: [] },
    // OpenAI's developer role is the template's system; a continued assistant message's parts join by a blank line
    { messages: [{ role: "developer", content: "hi" }] },
    {
      messages: [
        u("hi"),
        {
          role: "assistant",
          content: [
            { type: "text", text: "a" },
            { type: "text", text: "b" }
          ]
        }
      ]
    }
  ]

  it("usage.prompt_tokens, the slot's n_prompt_tokens and /apply-template's prompt, chat by chat", async () => {
    type Slot = { id_task?: number; n_prompt_tokens?: number }
    const latest = (ss: Array<Slot>) => ss.reduce((a, b) => ((b.id_task ?? -1) > (a.id_task ?? -1) ? b : a))
    for (const chat of chats) {
      const got: Array<unknown> = []
      for (const base of [main.real, main.sim]) {
        const r = JSON.parse((await post(base, "/v1/chat/completions", { ...chat, max_tokens: 3 })).text)
        const slot = latest(JSON.parse((await request(`${base}/slots`)).text) as Array<Slot>)
        const t = JSON.parse((await post(base, "/apply-template", chat)).text) as { prompt: string }
        // the slot keeps the prompt and all but the last of the 3 tokens made
        got.push([r.usage.prompt_tokens, (slot.n_prompt_tokens ?? 0) - (r.usage.completion_tokens - 1), t.prompt])
      }
      expect([chat, got[1]]).toEqual([chat, got[0]])
    }
  })

  it("near a slot's context (512): the prompt and the answer's room, then the refusal, as the real server counts", async () => {
    // a user message of n words: the template and the BOS add 28 (-c 1024 over -np 2)
    const chat = (n: number, max: number) => ({ messages: [u(Array(n).fill("the").join(" "))], max_tokens: max })
    for (const [n, max] of [
      [482, 5],
      [483, 5],
      [484, 1]
    ] as const) {
      const C = "/v1/chat/completions"
      const [r, s] = [await post(main.real, C, chat(n, max)), await post(main.sim, C, chat(n, max))]
      const sum = (t: string) => {
        const j = JSON.parse(t)
        return j.error ?? [j.usage.prompt_tokens, j.usage.completion_tokens, j.choices[0].finish_reason]
      }
      expect([n, max, s.status, sum(s.text)]).toEqual([n, max, r.status, sum(r.text)])
    }
  })
})

describe("completions beyond the text: the simulator against the real server", () => {
  it("a streamed answer to several prompts: each task but the first begins with `data: null`", async () => {
    const cases: Array<[unknown, Array<boolean>]> = [
      [["a b", "c d"], [true]],
      [
        ["a b", "c d", "e f"],
        [true, false]
      ]
    ]
    for (const [prompt, startsWithNull] of cases) {
      const body = { prompt, max_tokens: 2, stream: true }
      for (const base of [main.real, main.sim]) {
        const es = events((await post(base, "/v1/completions", body)).text)
        expect([base, prompt, es.filter((e) => e === null).length]).toEqual([base, prompt, (prompt as []).length - 1])
        expect([base, prompt, es[0] === null]).toEqual([base, prompt, startsWithNull[0]])
      }
    }
    // n completions of one prompt are children: no null
    for (const base of [main.real, main.sim]) {
      const es = events((await post(base, "/v1/completions", { prompt: "a", n: 2, max_tokens: 2, stream: true })).text)
      expect([base, es.includes(null)]).toEqual([base, false])
    }
  })

  it("token ids outside the vocabulary: the same 400, streamed or not", async () => {
    for (const prompt of [
      [1, 99999999],
      [1, -5],
      [1, 32000],
      [
        [1, 2],
        [1, 40000]
      ]
    ]) {
      for (const stream of [false, true]) {
        const body = { prompt, max_tokens: 2, stream }
        const [r, s] = [await post(main.real, "/v1/completions", body), await post(main.sim, "/v1/completions", body)]
        expect([prompt, stream, s.status, s.text]).toEqual([prompt, stream, r.status, r.text])
      }
    }
  })

  it("logprobs: the same shapes whole and streamed, top lists of the asked length, valid values", async () => {
    const C = "/v1/completions"
    const H = "/v1/chat/completions"
    const chat = { messages: [{ role: "user", content: "a" }], max_tokens: 2 }
    const cases: Array<[string, Record<string, unknown>, number]> = [
      [C, { prompt: "a", max_tokens: 2, logprobs: 2 }, 2],
      [C, { prompt: "a", max_tokens: 2, n_probs: 3 }, 3],
      [C, { prompt: "a", max_tokens: 2, logprobs: true }, 1],
      [H, { ...chat, logprobs: true, top_logprobs: 2 }, 2],
      [H, { ...chat, logprobs: true }, 20],
      [C, { prompt: "a", max_tokens: 2, n_probs: 2, post_sampling_probs: true }, 2]
    ]
    type Entry = Record<string, unknown> & { token: string; bytes: Array<number> }
    for (const [p, body, n] of cases) {
      for (const stream of [false, true]) {
        const b = { ...body, stream }
        const [r, s] = [await post(main.real, p, b), await post(main.sim, p, b)]
        const bodies = (t: string) => (stream ? events(t).slice(0, -1) : [JSON.parse(t)])
        const [rb, sb] = [bodies(r.text), bodies(s.text)]
        const kinds = (bs: Array<unknown>) => [...new Set(bs.map((x) => JSON.stringify(shape(x))))].sort()
        expect([p, b, kinds(sb)]).toEqual([p, b, kinds(rb)])
        for (const x of sb as Array<{ choices: Array<Record<string, unknown>> }>) {
          for (const c of x.choices) {
            const lp = c.logprobs as { content: Array<Entry> } | null | undefined
            if (lp === null || lp === undefined) continue
            const post1 = body.post_sampling_probs === true
            const text = (c.text ??
              (c.message as { content?: string })?.content ??
              (c.delta as { content?: string })?.content) as string
            expect(lp.content.map((e) => e.token).join("")).toBe(text)
            for (const e of lp.content) {
              const v = e[post1 ? "prob" : "logprob"] as number
              expect(post1 ? v > 0 && v <= 1 : v <= 0).toBe(true)
              expect(Buffer.from(e.bytes).toString()).toBe(e.token)
              expect((e[post1 ? "top_probs" : "top_logprobs"] as Array<unknown>).length).toBe(n)
            }
          }
        }
      }
    }
    const bad = { ...chat, top_logprobs: 3 }
    const [r, s] = [await post(main.real, H, bad), await post(main.sim, H, bad)]
    expect([s.status, s.text]).toEqual([r.status, r.text])
  })

  it("timings_per_token: `timings` on every streamed chunk", async () => {
    for (const [p, body] of [
      ["/v1/completions", { prompt: "a" }],
      ["/v1/chat/completions", { messages: [{ role: "user", content: "a" }] }]
    ] as const) {
      for (const base of [main.real, main.sim]) {
        const t = await post(base, p, { ...body, max_tokens: 3, stream: true, timings_per_token: true })
        const chunks = events(t.text).slice(0, -1) as Array<Record<string, unknown>>
        // chat's role chunk goes before any token is timed
        const tokens = chunks.filter((c) => !JSON.stringify(c).includes('"role":"assistant"'))
        expect([base, p, tokens.every((c) => c.timings !== undefined)]).toEqual([base, p, true])
      }
    }
  })
})
