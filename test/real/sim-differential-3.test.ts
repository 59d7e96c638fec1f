// Differential check of the llama_cpp simulator against the real llama-server, continued (sim-differential.test.ts
// and sim-differential-2.test.ts have the rest): `grammar` and `json_schema`. A grammar that does not parse fails the
// slot's launch, 400 "Failed to initialize samplers: failed to parse grammar" (server-context.cpp
// launch_slot_with_task, common/sampling.cpp common_sampler_init), a non-string one is ignored, and a completion's
// json_schema the converter refuses is 400 `Field 'json_schema': "json_schema": JSON schema conversion failed:...`
// (server-schema.cpp, common/json-schema-to-grammar.cpp). Refusals are compared word for word; an answer the real
// server gives under a grammar is the grammar's, so of a taken one only the status is.
import { beforeAll, describe, expect, it } from "vitest"
import { answersOf, type Pair, pairs, sameAnswers } from "./simPair.ts"

const diff = pairs("cgn-real-diff3-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

const both = (p: string, body: Record<string, unknown>) => answersOf(pair, p, body)
const same = sameAnswers

const completion = (extra: Record<string, unknown>) => ({ prompt: "a b", max_tokens: 2, ...extra })
const chat = (extra: Record<string, unknown>) => ({
  messages: [{ role: "user", content: "a b" }],
  max_tokens: 2,
  ...extra
})

const REFUSED = [
  ['foo ::= "a"', "no root rule"],
  ["nonsense", "no ::="],
  ["   ", "no rule at all"],
  ['root ::= my_x\nmy_x ::= "a"', "an underscore, no word character"],
  ["root ::= b\n", "an undefined rule"],
  ['root ::= root "a"\n', "left recursion"],
  ['root ::= "a"**', "left recursion through a repetition of a repetition"],
  ['root ::= ""*', "a repetition of nothing"],
  ['root ::= "\\q"', "an unknown escape"],
  ['root ::= "a" "b"\n"c"', "a line that is no rule"],
  ['root ::= ( "a" | "b"', "an unclosed group"],
  ['root ::= "a"{3001}', "repetitions past 2000"]
] as const

const TAKEN = [
  ['root ::= "a"', "one literal"],
  ["root ::= ", "an empty rule"],
  ['root ::= x\nx ::= "a" [b-c]* ("d" | "e"){1,3} .?\n', "classes, groups, repetitions"],
  ['root ::= "a" # c\n\n# more\nb ::= [^x]\n', "comments and blank lines"],
  ['root ::= ( "a"\n | "b" )\n', "a group over lines"],
  ['root ::= ("a"?)*', "a repetition of a group that may be empty"],
  ["root ::= <[5]> !<[6]>", "token ids"],
  ['root ::= "\\x41\\n"', "escapes"]
] as const

describe("grammar: the simulator against the real server", () => {
  for (const [grammar, why] of REFUSED) {
    it(`refused 400, streamed or not, completion or chat: ${why}`, async () => {
      for (const [p, body] of [
        ["/v1/completions", completion({ grammar })],
        ["/v1/completions", completion({ grammar, stream: true })],
        ["/v1/chat/completions", chat({ grammar })]
      ] as const) {
        const got = await both(p, body)
        expect([p, body, ...got]).toEqual([p, body, ...same(got)])
        expect(got[0]).toBe(400)
      }
    })
  }

  for (const [grammar, why] of TAKEN) {
    it(`taken: ${why}`, async () => {
      const got = await both("/v1/completions", completion({ grammar }))
      expect([grammar, ...got]).toEqual([grammar, 200, 200])
    })
  }

  it("an empty or non-string grammar is ignored; max_tokens 0 still starts the sampler", async () => {
    for (const [p, body] of [
      ["/v1/completions", completion({ grammar: "" })],
      ["/v1/completions", completion({ grammar: 5 })],
      ["/v1/chat/completions", chat({ grammar: 7 })],
      ["/v1/completions", completion({ grammar: 'foo ::= "a"', max_tokens: 0 })]
    ] as const) {
      const got = await both(p, body)
      expect([body, ...got]).toEqual([body, ...same(got)])
    }
  })
})

describe("json_schema on a completion: the simulator against the real server", () => {
  it("a schema the converter does not recognize: the same 400, word for word", async () => {
    for (const json_schema of [{ type: "foo" }, { type: "foo", b: "é", a: [1, true, null] }, 5, true, "x"]) {
      const got = await both("/v1/completions", completion({ json_schema }))
      expect([json_schema, ...got]).toEqual([json_schema, ...same(got)])
      expect(got[0]).toBe(400)
    }
  })

  it("taken: a primitive type, an empty array, a schema beside a grammar key (even null)", async () => {
    for (const extra of [
      { json_schema: { type: "string" } },
      { json_schema: [] },
      { json_schema: { type: "foo" }, grammar: null },
      { json_schema: "x", grammar: 'root ::= "a"' }
    ]) {
      const got = await both("/v1/completions", completion(extra))
      expect([extra, ...got]).toEqual([extra, 200, 200])
    }
  })
})
