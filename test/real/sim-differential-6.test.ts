// Differential check of the llama_cpp simulator against the real llama-server, continued (sim-differential-3.test.ts
// has the first grammar and json_schema cases): more of the GBNF parser (llama-grammar.cpp: rule names are
// [a-zA-Z0-9-], the escapes \[ \] \- in a class, the grammar read as a C string up to a NUL, no newline between a
// rule's name and ::=, a token reference closed by '>', a rule's alternates ended by a newline or the end), the
// json_schema types and keys the converter takes (json-schema-to-grammar.cpp PRIMITIVE_RULES, and visit()'s branches
// before `type`), and request fields (server-schema.cpp): sse_ping_interval's -1, the first of two bad fields, an
// INT64 limit's words, an empty sub-prompt. Refusals are compared word for word; an answer the real server gives
// under a grammar is the grammar's, so of a taken one only the status is.
import { beforeAll, describe, expect, it } from "vitest"
import {
  GRAMMARS_REFUSED,
  GRAMMARS_TAKEN,
  JSON_SCHEMA_PRIMITIVE_TYPES,
  JSON_SCHEMAS_UNRECOGNIZED
} from "../support/llamaFacts.ts"
import { postOnOwnConnection as post } from "./engine.ts"
import { answersOf, type Pair, pairs, sameAnswers } from "./simPair.ts"

const diff = pairs("cgn-real-diff6-")
let pair: Pair

beforeAll(async () => {
  pair = await diff.pair()
}, 30 * 60_000)

const both = (p: string, body: Record<string, unknown>) => answersOf(pair, p, body)
const same = sameAnswers

const completion = (extra: Record<string, unknown>) => ({ prompt: "a b", max_tokens: 2, ...extra })

const TAKEN = GRAMMARS_TAKEN
const REFUSED = GRAMMARS_REFUSED

describe("grammar: the simulator against the real server, continued", () => {
  for (const [grammar, why] of TAKEN) {
    it(`taken: ${why}`, async () => {
      const got = await both("/v1/completions", completion({ grammar }))
      expect([grammar, ...got]).toEqual([grammar, 200, 200])
    })
  }

  for (const [grammar, why] of REFUSED) {
    it(`refused 400, word for word: ${why}`, async () => {
      const got = await both("/v1/completions", completion({ grammar }))
      expect([grammar, ...got]).toEqual([grammar, ...same(got)])
      expect(got[0]).toBe(400)
    })
  }
})

describe("json_schema: the simulator against the real server, continued", () => {
  it("taken: every primitive rule's name as the type", async () => {
    for (const type of JSON_SCHEMA_PRIMITIVE_TYPES) {
      const got = await both("/v1/completions", completion({ json_schema: { type } }))
      expect([type, ...got]).toEqual([type, 200, 200])
    }
  })

  it("taken: an unknown type beside a key visit() acts on first (enum, const, anyOf, oneOf)", async () => {
    for (const json_schema of [
      { type: "foo", enum: [1] },
      { type: "foo", const: 1 },
      { type: "foo", anyOf: [{ type: "string" }] },
      { type: "foo", oneOf: [{ type: "string" }] }
    ]) {
      const got = await both("/v1/completions", completion({ json_schema }))
      expect([json_schema, ...got]).toEqual([json_schema, 200, 200])
    }
  })

  it("refused word for word: an unknown type beside keys visit() reads only for other types", async () => {
    for (const json_schema of JSON_SCHEMAS_UNRECOGNIZED) {
      const got = await both("/v1/completions", completion({ json_schema }))
      expect([json_schema, ...got]).toEqual([json_schema, ...same(got)])
      expect(got[0]).toBe(400)
    }
  })

  it("refused, its keys dumped as sent: an integer-like key (the simulator dumps it first, as JS orders keys)", async () => {
    const got = await both("/v1/completions", completion({ json_schema: { type: "foo", "0": 1 } }))
    expect([got[0], got[2]]).toEqual([400, 400])
  })

  it("a request's n_probs is shown in /slots as sent, -1 too", async () => {
    const shown = async (base: string) => {
      await post(base, "/v1/completions", completion({ n_probs: -1 }))
      const slots = JSON.parse(await (await fetch(`${base}/slots`)).text()) as Array<{ params?: { n_probs?: number } }>
      return slots.map((s) => s.params?.n_probs).filter((n) => n !== undefined && n !== 0)
    }
    expect(await shown(pair.real)).toEqual([-1])
    expect(await shown(pair.sim)).toEqual([-1])
  })

  it("a chat's json_schema is never refused in the completion's words (its chat template converts it)", async () => {
    const body = { messages: [{ role: "user", content: "a b" }], max_tokens: 2, json_schema: { type: "foo" } }
    for (const base of pair.bases) {
      const r = await post(base, "/v1/chat/completions", body)
      expect([base, r.text.includes("Field 'json_schema'")]).toEqual([base, false])
    }
  })
})

describe("request fields: the simulator against the real server, continued", () => {
  it("sse_ping_interval -1 (no pings) is taken, -2 refused word for word", async () => {
    expect(await both("/v1/completions", completion({ sse_ping_interval: -1 }))).toEqual([200, 200])
    expect(await both("/v1/completions", completion({ sse_ping_interval: -1, stream: true }))).toEqual([200, 200])
    const got = await both("/v1/completions", completion({ sse_ping_interval: -2 }))
    expect(got).toEqual(same(got))
    expect(got[0]).toBe(400)
  })

  it("two bad fields: the first in the schema's order is reported (timings_per_token before stream)", async () => {
    const got = await both("/v1/completions", completion({ stream: 1, timings_per_token: 1 }))
    expect(got).toEqual(same(got))
    expect(String(got[1])).toContain("timings_per_token")
  })

  it("t_max_predict_ms past INT64: the limit in std::to_string's digits", async () => {
    const words = async (base: string) => {
      const r = await post(base, "/v1/completions", completion({ t_max_predict_ms: 1e19 }))
      // what follows "but got" (the double wrapped into int64) is compared in sim-differential-8
      return [r.status, (JSON.parse(r.text) as { error: { message: string } }).error.message.split(" but got")[0]]
    }
    const real = await words(pair.real)
    expect(real).toEqual([400, "Field 't_max_predict_ms': Value must be between -1 <= value <= 9223372036854775807,"])
    expect(await words(pair.sim)).toEqual(real)
  })

  it("an empty token list among the prompts is a prompt of its own: a choice with no prompt text", async () => {
    const shape = async (base: string) => {
      const r = await post(base, "/v1/completions", completion({ prompt: [[], "a b"] }))
      const choices = (JSON.parse(r.text) as { choices?: Array<{ index: number }> }).choices ?? []
      return [r.status, choices.map((c) => c.index).sort()]
    }
    const real = await shape(pair.real)
    expect(real).toEqual([200, [0, 1]])
    expect(await shape(pair.sim)).toEqual(real)
  })
})
