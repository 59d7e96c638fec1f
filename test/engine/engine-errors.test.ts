// Error-body normalization per engine flavor: every shape the engines send becomes the same EngineError fields.
import { describe, expect, it } from "vitest"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import * as EngineErrors from "../../src/services/engine/EngineErrors.ts"
import { isErrorChunk, markOutputFault, NO_SECRETS } from "../../src/services/engine/EngineErrors.ts"

// The shapes, with no secret to scrub (what is scrubbed: engine-error-secrets.test.ts).
const errorDetailOfBody = (body: string, status: number | undefined) =>
  EngineErrors.errorDetailOfBody(body, status, NO_SECRETS)
const httpError = (status: number, body: string) => EngineErrors.httpError(status, body, NO_SECRETS)
const streamError = (obj: unknown) => EngineErrors.streamError(obj, NO_SECRETS)

const fields = (e: { reason: string; message: string; status?: number; engineType?: string; engineCode?: string }) => ({
  reason: e.reason,
  message: e.message,
  status: e.status,
  engineType: e.engineType,
  engineCode: e.engineCode
})

describe("httpError per flavor", () => {
  const cases: ReadonlyArray<[string, number, string, ReturnType<typeof fields>]> = [
    [
      "vLLM >= 0.10.1 nested",
      400,
      '{"error":{"message":"max_tokens must be at least 1","type":"BadRequestError","param":null,"code":400}}',
      {
        reason: "Http",
        message: "max_tokens must be at least 1",
        status: 400,
        engineType: "BadRequestError",
        engineCode: undefined
      }
    ],
    [
      "old vLLM / SGLang flat",
      404,
      '{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}',
      {
        reason: "Http",
        message: "The model `x` does not exist.",
        status: 404,
        engineType: "NotFoundError",
        engineCode: undefined
      }
    ],
    [
      "llama.cpp",
      400,
      '{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}',
      {
        reason: "Http",
        message: "the request exceeds the available context size",
        status: 400,
        engineType: "exceed_context_size_error",
        engineCode: undefined
      }
    ],
    [
      "llama.cpp loading (503)",
      503,
      '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
      { reason: "Http", message: "Loading model", status: 503, engineType: "unavailable_error", engineCode: undefined }
    ],
    [
      "mlx string error",
      404,
      '{"error":"Model not found"}',
      { reason: "Http", message: "Model not found", status: 404, engineType: undefined, engineCode: undefined }
    ],
    [
      "OpenAI-style string code (openai_compat)",
      401,
      '{"error":{"message":"Incorrect API key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}',
      {
        reason: "Http",
        message: "Incorrect API key",
        status: 401,
        engineType: "invalid_request_error",
        engineCode: "invalid_api_key"
      }
    ],
    [
      "code differing from the status is kept",
      500,
      '{"object":"error","message":"boom","type":"InternalServerError","code":503}',
      { reason: "Http", message: "boom", status: 500, engineType: "InternalServerError", engineCode: "503" }
    ],
    [
      "flat error object without a message",
      500,
      '{"object":"error","type":"InternalServerError","code":500}',
      { reason: "Http", message: "engine error", status: 500, engineType: "InternalServerError", engineCode: undefined }
    ],
    [
      "FastAPI detail string",
      404,
      '{"detail":"Not Found"}',
      { reason: "Http", message: "Not Found", status: 404, engineType: undefined, engineCode: undefined }
    ],
    [
      "FastAPI validation list",
      422,
      '{"detail":[{"loc":["body","messages"],"msg":"Field required","type":"missing"}]}',
      {
        reason: "Http",
        message: "body.messages: Field required",
        status: 422,
        engineType: undefined,
        engineCode: undefined
      }
    ],
    [
      "non-JSON body",
      502,
      "<html>Bad Gateway</html>\n",
      { reason: "Http", message: "<html>Bad Gateway</html>", status: 502, engineType: undefined, engineCode: undefined }
    ],
    [
      "broken JSON body",
      500,
      '{"error": {"mess',
      { reason: "Http", message: '{"error": {"mess', status: 500, engineType: undefined, engineCode: undefined }
    ],
    [
      "empty body",
      500,
      "",
      { reason: "Http", message: "HTTP 500", status: 500, engineType: undefined, engineCode: undefined }
    ],
    [
      "JSON without an error shape",
      500,
      '{"foo":1}',
      { reason: "Http", message: '{"foo":1}', status: 500, engineType: undefined, engineCode: undefined }
    ]
  ]
  for (const [name, status, body, expected] of cases) {
    it(name, () => {
      expect(fields(httpError(status, body))).toEqual(expected)
    })
  }

  it("long text bodies are cut", () => {
    const d = errorDetailOfBody("x".repeat(2000), 500)
    expect(d.message.length).toBeLessThan(510)
  })

  // The message becomes the gRPC status message: 20,000 "é" (120 KB percent-encoded) broke the caller's header
  // limit, and the call ended INTERNAL "RST_STREAM with code 2" without the engine's status or words.
  it("long messages (500 characters) and types (64) in JSON bodies are cut as well", () => {
    const e = httpError(400, JSON.stringify({ error: { message: "é".repeat(20_000), type: "t".repeat(2000) } }))
    expect([e.message.length, e.engineType?.length]).toEqual([501, 65])
    expect(errorDetailOfBody(JSON.stringify({ object: "error", message: "m".repeat(5000) }), 400).message).toBe(
      `${"m".repeat(500)}…`
    )
  })
})

describe("mid-stream error objects", () => {
  it("vLLM nested error chunk: Stream with the numeric code as status", () => {
    const obj = { error: { message: "engine died", type: "InternalServerError", param: null, code: 500 } }
    expect(isErrorChunk(obj)).toBe(true)
    expect(fields(streamError(obj))).toEqual({
      reason: "Stream",
      message: "engine died",
      status: 500,
      engineType: "InternalServerError",
      engineCode: undefined
    })
  })
  it("SGLang flat error chunk", () => {
    const obj = { object: "error", message: "aborted", type: "InternalServerError", code: 500 }
    expect(isErrorChunk(obj)).toBe(true)
    expect(fields(streamError(obj)).message).toBe("aborted")
  })
  it('a code sent as a number in a string (SGLang\'s "503") is a status all the same', () => {
    const obj = { error: { object: "error", message: "overloaded", type: "SERVICE_UNAVAILABLE", code: "503" } }
    expect(fields(streamError(obj))).toEqual({
      reason: "Stream",
      message: "overloaded",
      status: 503,
      engineType: "SERVICE_UNAVAILABLE",
      engineCode: undefined
    })
  })
  it("mlx string error chunk", () => {
    expect(fields(streamError({ error: "out of memory" }))).toEqual({
      reason: "Stream",
      message: "out of memory",
      status: undefined,
      engineType: undefined,
      engineCode: undefined
    })
  })
  it("an ordinary chunk is not an error", () => {
    expect(isErrorChunk({ id: "c1", object: "chat.completion.chunk", choices: [] })).toBe(false)
  })
})

describe("output faults (a backend's capabilities.outputFaults)", () => {
  const prefixes = ["The model produced output that does not match the expected "]
  const body = (message: string) => JSON.stringify({ error: { code: 500, message, type: "server_error" } })
  it("an HTTP error or a stream's error whose message begins as one is marked, its other fields kept", () => {
    const message = "The model produced output that does not match the expected Content-only format"
    const http = markOutputFault(httpError(500, body(message)), prefixes)
    expect([http.fault, fields(http)]).toEqual([
      "output",
      { reason: "Http", message, status: 500, engineType: "server_error", engineCode: undefined }
    ])
    expect(markOutputFault(streamError({ error: { code: 500, message, type: "server_error" } }), prefixes).fault).toBe(
      "output"
    )
  })
  it("any other message, or a failure that is not the engine's answer, is left as it is", () => {
    expect(markOutputFault(httpError(500, body("boom")), prefixes).fault).toBeUndefined()
    // only a prefix counts: the words elsewhere in a message are another error's
    expect(markOutputFault(httpError(500, body(`x ${prefixes[0]}`)), prefixes).fault).toBeUndefined()
    const connect = new EngineError({ reason: "Connect", message: `${prefixes[0]}format` })
    expect(markOutputFault(connect, prefixes)).toBe(connect)
  })
})

describe("output faults: every field of the engine's error kept, any of the engine's prefixes", () => {
  it("an engine code (a string code) stays on the marked error, for the cgn-engine-code trailer", () => {
    const message = "The model produced output that does not match the expected JSON"
    const e = new EngineError({
      reason: "Stream",
      status: 500,
      message,
      engineType: "server_error",
      engineCode: "output_parse"
    })
    const marked = markOutputFault(e, ["The model produced output"])
    expect([marked.fault, fields(marked)]).toEqual([
      "output",
      { reason: "Stream", message, status: 500, engineType: "server_error", engineCode: "output_parse" }
    ])
  })
  it("a message that begins as any one of several prefixes is marked, not only as all of them", () => {
    const e = new EngineError({ reason: "Http", status: 500, message: "second kind of fault: x" })
    expect(markOutputFault(e, ["first kind", "second kind"]).fault).toBe("output")
    expect(markOutputFault(e, []).fault).toBeUndefined()
  })
})
