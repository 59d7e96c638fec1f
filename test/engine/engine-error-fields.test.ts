// What engine-errors.test.ts and its neighbours left open in reading an engine's error body
// (services/engine/EngineErrors.ts httpError, engineWords), found by a mutation audit: where the cut falls, which of
// the error object's fields stand in for its message, an empty field taken as absent, a numeric code JSON makes
// infinite, and FastAPI's list of validation errors read whole (fastapi/exception_handlers.py
// request_validation_exception_handler: `{"detail": [{"loc", "msg", "type"}, ...]}`, one entry per bad field).
import { describe, expect, it } from "vitest"
import type { EngineError } from "../../src/services/engine/EngineClient.ts"
import { engineWords, httpError, NO_SECRETS, streamError } from "../../src/services/engine/EngineErrors.ts"

const fields = (e: EngineError) => ({
  message: e.message,
  status: e.status,
  engineType: e.engineType,
  engineCode: e.engineCode
})

describe("engineWords: the engine's words, cut only when longer than the bound", () => {
  it("a message of exactly the bound is whole, with no mark of a cut; one character more is cut and marked", () => {
    expect(engineWords("a".repeat(500), 500, NO_SECRETS)).toBe("a".repeat(500))
    expect(engineWords("a".repeat(501), 500, NO_SECRETS)).toBe(`${"a".repeat(500)}…`)
    // so in an HTTP error's body too (the message bound is 500 characters)
    expect(httpError(400, JSON.stringify({ error: { message: "m".repeat(500) } }), NO_SECRETS).message).toBe(
      "m".repeat(500)
    )
  })
})

describe("httpError: the error object's fields", () => {
  it("its `message` is its words; `msg`, then `detail`, stand in only when it has none (or an empty one)", () => {
    const body = (error: object) => httpError(400, JSON.stringify({ error }), NO_SECRETS).message
    expect(body({ message: "from message", msg: "from msg", detail: "from detail" })).toBe("from message")
    expect(body({ message: "", msg: "from msg" })).toBe("from msg")
    expect(body({ detail: "from detail" })).toBe("from detail")
  })

  it("an empty type or code is no type or code (nothing in cgn-engine-type / -code)", () => {
    expect(fields(httpError(400, '{"error":{"message":"m","type":"","code":""}}', NO_SECRETS))).toEqual({
      message: "m",
      status: 400,
      engineType: undefined,
      engineCode: undefined
    })
  })

  it("a numeric code JSON reads as infinite (1e999) is no code: not a status, not a cgn-engine-code", () => {
    expect(fields(httpError(500, '{"error":{"message":"m","code":1e999}}', NO_SECRETS))).toEqual({
      message: "m",
      status: 500,
      engineType: undefined,
      engineCode: undefined
    })
    // a stream's error object: its code would be taken for the status
    expect(fields(streamError(JSON.parse('{"error":{"message":"m","code":1e999}}'), NO_SECRETS))).toEqual({
      message: "m",
      status: undefined,
      engineType: undefined,
      engineCode: undefined
    })
  })

  it("FastAPI's validation errors: every field's, each with its location, in one message", () => {
    const detail = [
      { loc: ["body", "max_tokens"], msg: "Input should be a valid integer", type: "int_parsing" },
      { loc: ["body", "n"], msg: "Input should be greater than 0", type: "greater_than" }
    ]
    expect(httpError(422, JSON.stringify({ detail }), NO_SECRETS).message).toBe(
      "body.max_tokens: Input should be a valid integer; body.n: Input should be greater than 0"
    )
  })
})
