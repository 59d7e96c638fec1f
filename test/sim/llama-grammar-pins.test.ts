// The llama_cpp simulator's grammar, json_schema and request-field checks as pure functions, pinned to what the real
// llama-server answered (measured with test/real/sim-differential-6.test.ts, which sends the same bodies to both):
// these run without the real binary. Rules: llama-grammar.cpp (parse_name, parse_char, parse_token, parse_rule),
// json-schema-to-grammar.cpp (PRIMITIVE_RULES, common_schema_converter::visit), server-schema.cpp (the field order
// and hard limits), server-common.cpp tokenize_input_subprompt.
import { describe, expect, it } from "vitest"
import { grammarParses } from "../../src/sim/llamaGrammar.ts"
import { jsonSchemaError } from "../../src/sim/llamaJsonSchema.ts"
import { llamaPrompts } from "../../src/sim/llamaPrompts.ts"
import { llamaParams } from "../../src/sim/llamaRequest.ts"
import {
  GRAMMARS_REFUSED,
  GRAMMARS_TAKEN,
  JSON_SCHEMA_PRIMITIVE_TYPES,
  JSON_SCHEMAS_UNRECOGNIZED
} from "../support/llamaFacts.ts"

describe("grammarParses: as the real llama-server parses", () => {
  it.each(GRAMMARS_TAKEN)("taken: %j (%s)", (grammar) => {
    expect(grammarParses(grammar)).toBe(true)
  })

  it.each(GRAMMARS_REFUSED)("refused: %j (%s)", (grammar) => {
    expect(grammarParses(grammar)).toBe(false)
  })
})

describe("jsonSchemaError: the types and keys the converter takes", () => {
  it.each(JSON_SCHEMA_PRIMITIVE_TYPES)("a primitive rule's name as the type: %s", (type) => {
    expect(jsonSchemaError({ type })).toBeUndefined()
  })

  it("an unknown type beside a key visit() acts on first is taken; alone it is refused", () => {
    for (const k of [{ enum: [1] }, { const: 1 }, { anyOf: [{ type: "string" }] }, { oneOf: [{ type: "string" }] }]) {
      expect([k, jsonSchemaError({ type: "foo", ...k })]).toEqual([k, undefined])
    }
    expect(jsonSchemaError({ type: "foo" })).toBe('JSON schema conversion failed:\nUnrecognized schema: {"type":"foo"}')
  })
})

describe("jsonSchemaError: refused as the real server refuses", () => {
  it.each(JSON_SCHEMAS_UNRECOGNIZED)("an unknown type beside a key read only for other types: %j", (schema) => {
    expect(jsonSchemaError(schema)).toBe(
      `JSON schema conversion failed:\nUnrecognized schema: ${JSON.stringify(schema)}`
    )
  })

  it("an integer-like key changes nothing: refused", () => {
    expect(jsonSchemaError({ type: "foo", "0": 1 })).toContain("Unrecognized schema")
  })
})

describe("llamaParams and llamaPrompts: the real server's answers", () => {
  it("n_probs is kept as sent, -1 too (/slots shows it)", () => {
    expect(llamaParams({ n_probs: -1 }, 2)).toMatchObject({ nProbs: -1 })
  })

  it("sse_ping_interval -1 (no pings) is taken, -2 refused", () => {
    expect(llamaParams({ sse_ping_interval: -1 }, 2)).toMatchObject({ ssePingInterval: -1 })
    expect(llamaParams({ sse_ping_interval: -2 }, 2)).toEqual({
      status: 400,
      message: "Field 'sse_ping_interval': Value must be between -1 <= value <= 2147483647, but got -2"
    })
  })

  it("two bad fields: timings_per_token is reported before stream", () => {
    expect(llamaParams({ stream: 1, timings_per_token: 1 }, 2)).toEqual({
      status: 400,
      message: "Field 'timings_per_token': [json.exception.type_error.302] type must be boolean, but is number"
    })
  })

  it("t_max_predict_ms past INT64: the limit in std::to_string's digits", () => {
    const r = llamaParams({ t_max_predict_ms: 1e19 }, 2)
    expect("message" in r && r.message.split(" but got")[0]).toBe(
      "Field 't_max_predict_ms': Value must be between -1 <= value <= 9223372036854775807,"
    )
  })

  it("a chat's json_schema is not refused in the completion's words (its chat template converts it)", () => {
    const r = llamaParams({ json_schema: { type: "foo" } }, 2, true)
    expect("message" in r && r.message.startsWith("Field 'json_schema'")).toBe(false)
  })

  it("an empty token list among the prompts is a prompt of its own", () => {
    const ps = llamaPrompts({ prompt: [[], "a b"] })
    expect(Array.isArray(ps) && ps.length).toBe(2)
  })
})
