// Pure tables for the Generate translation: validation statuses, the OpenAI body, chunk reading,
// the coalescer's bound, and the one status table (GrpcStatus) for engine and agent errors.
import { Result } from "effect"
import { Status } from "nice-grpc-common"
import { describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import { AgentDefect } from "../../src/services/grpc/CallErrors.ts"
import { ChunkReader, Coalescer } from "../../src/services/grpc/ChunkReader.ts"
import { GenerateRejected, planRequest, type RequestPlan, utf8Bytes } from "../../src/services/grpc/Generate.ts"
import {
  asciiTrailer,
  engineFailure,
  httpStatusToGrpc,
  statusName,
  toGrpcFailure
} from "../../src/services/grpc/GrpcStatus.ts"

const config = (
  agent: Record<string, unknown> = {},
  model: Record<string, unknown> = {},
  engine: Record<string, unknown> = {}
): AgentConfig => {
  const r = decodeConfigObject(
    {
      agent: { node_id: "n1", max_tokens_limit: 100, max_request_bytes: 64, ...agent },
      engine,
      models: { m: { hf_repo: "org/m", served_name: "served", ...model } }
    },
    undefined,
    {}
  )
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}
const cfg = config()

const req = (p: Parameters<typeof GenerateRequest.fromPartial>[0]): GenerateRequest => GenerateRequest.fromPartial(p)

const plan = (p: Parameters<typeof GenerateRequest.fromPartial>[0], c: AgentConfig = cfg): RequestPlan => {
  const r = planRequest(req(p), c)
  if (r instanceof GenerateRejected) throw new Error(`rejected: ${r.message}`)
  return r
}

const rejected = (p: Parameters<typeof GenerateRequest.fromPartial>[0], c: AgentConfig = cfg): GenerateRejected => {
  const r = planRequest(req(p), c)
  if (!(r instanceof GenerateRejected)) throw new Error(`expected a rejection, got ${JSON.stringify(r.body)}`)
  return r
}

describe("planRequest: validation", () => {
  const cases: ReadonlyArray<{
    name: string
    req: Parameters<typeof GenerateRequest.fromPartial>[0]
    reason: GenerateRejected["reason"]
    field: string
    says: RegExp
  }> = [
    { name: "no input", req: {}, reason: "invalid_argument", field: "input", says: /set either `chat`.*or `prompt`/ },
    { name: "empty prompt", req: { prompt: "" }, reason: "invalid_argument", field: "prompt", says: /prompt is empty/ },
    {
      name: "empty chat",
      req: { chat: { messages: [] } },
      reason: "invalid_argument",
      field: "chat.messages",
      says: /at least one message/
    },
    {
      name: "bad role",
      req: {
        chat: {
          messages: [
            { role: "user", content: "a" },
            { role: "robot", content: "b" }
          ]
        }
      },
      reason: "invalid_argument",
      field: "chat.messages[1].role",
      says: /"robot" is not one of system, user/
    },
    {
      name: "unknown model",
      req: { model: "other", prompt: "hi" },
      reason: "model_not_served",
      field: "model",
      says: /"other" is not served here; this node serves "served"/
    },
    {
      name: "request id with a line break (it becomes the engine's X-Request-Id header)",
      req: { requestId: "a\r\nx-evil: 1", prompt: "hi" },
      reason: "invalid_argument",
      field: "request_id",
      says: /request_id must be at most 256 printable ASCII characters/
    },
    {
      // HTTP trims a header value's spaces: the engine would log "x" for " x "
      name: "request id with a space at either end",
      req: { requestId: " x ", prompt: "hi" },
      reason: "invalid_argument",
      field: "request_id",
      says: /request_id must be at most 256 printable ASCII characters, no space at either end/
    },
    {
      name: "request id of spaces only",
      req: { requestId: "   ", prompt: "hi" },
      reason: "invalid_argument",
      field: "request_id",
      says: /no space at either end/
    },
    {
      name: "request id too long",
      req: { requestId: "r".repeat(257), prompt: "hi" },
      reason: "invalid_argument",
      field: "request_id",
      says: /request_id must be at most 256/
    },
    {
      // DEL is no printable ASCII either: Node's Headers would carry it to the engine's X-Request-Id
      name: "request id with DEL (0x7f)",
      req: { requestId: "a\x7fb", prompt: "hi" },
      reason: "invalid_argument",
      field: "request_id",
      says: /request_id must be at most 256 printable ASCII characters/
    },
    {
      name: "prompt too large",
      req: { prompt: "x".repeat(65) },
      reason: "request_too_large",
      field: "prompt",
      says: /65 bytes, above this node's limit of 64 bytes \(\[agent\]\.max_request_bytes\)/
    },
    {
      name: "chat too large (multi-byte)",
      req: { chat: { messages: [{ role: "user", content: "é".repeat(33) }] } },
      reason: "request_too_large",
      field: "chat",
      says: /66 bytes/
    },
    {
      name: "max_tokens 0",
      req: { prompt: "a", sampling: { maxTokens: 0 } },
      reason: "invalid_argument",
      field: "sampling.max_tokens",
      says: />= 1, got 0/
    },
    {
      name: "max_tokens above the limit",
      req: { prompt: "a", sampling: { maxTokens: 101 } },
      reason: "invalid_argument",
      field: "sampling.max_tokens",
      says: /101 is above this node's limit of 100 \(\[agent\]\.max_tokens_limit\); ask for at most 100/
    },
    {
      name: "temperature",
      req: { prompt: "a", sampling: { temperature: 2.5 } },
      reason: "invalid_argument",
      field: "sampling.temperature",
      says: /must be in 0\.\.2, got 2\.5/
    },
    {
      name: "negative temperature",
      req: { prompt: "a", sampling: { temperature: -0.1 } },
      reason: "invalid_argument",
      field: "sampling.temperature",
      says: /0\.\.2/
    },
    {
      name: "top_p 0",
      req: { prompt: "a", sampling: { topP: 0 } },
      reason: "invalid_argument",
      field: "sampling.top_p",
      says: /\(0, 1\], got 0/
    },
    {
      name: "top_p above 1",
      req: { prompt: "a", sampling: { topP: 1.5 } },
      reason: "invalid_argument",
      field: "sampling.top_p",
      says: /\(0, 1\]/
    },
    {
      name: "top_k 0",
      req: { prompt: "a", sampling: { topK: 0 } },
      reason: "invalid_argument",
      field: "sampling.top_k",
      says: /-1 \(off\) or >= 1, got 0/
    },
    {
      name: "presence_penalty",
      req: { prompt: "a", sampling: { presencePenalty: 3 } },
      reason: "invalid_argument",
      field: "sampling.presence_penalty",
      says: /-2\.\.2/
    },
    {
      name: "frequency_penalty",
      req: { prompt: "a", sampling: { frequencyPenalty: -2.5 } },
      reason: "invalid_argument",
      field: "sampling.frequency_penalty",
      says: /-2\.\.2/
    },
    {
      name: "repetition_penalty",
      req: { prompt: "a", sampling: { repetitionPenalty: 0 } },
      reason: "invalid_argument",
      field: "sampling.repetition_penalty",
      says: /^sampling\.repetition_penalty must be > 0 and finite \(1 is neutral\), got 0$/
    },
    {
      // JSON has no infinity: it would reach the engine as null, the engine's default
      name: "repetition_penalty infinite",
      req: { prompt: "a", sampling: { repetitionPenalty: Number.POSITIVE_INFINITY } },
      reason: "invalid_argument",
      field: "sampling.repetition_penalty",
      says: /> 0 and finite.*got Infinity/
    },
    {
      name: "NaN",
      req: { prompt: "a", sampling: { temperature: Number.NaN } },
      reason: "invalid_argument",
      field: "sampling.temperature",
      says: /got NaN/
    },
    {
      name: "too many stops",
      req: { prompt: "a", sampling: { stop: Array.from({ length: 17 }, (_, i) => `s${i}`) } },
      reason: "invalid_argument",
      field: "sampling.stop",
      says: /17 sequences; at most 16/
    },
    {
      name: "empty stop",
      req: { prompt: "a", sampling: { stop: ["x", ""] } },
      reason: "invalid_argument",
      field: "sampling.stop",
      says: /stop\[1\] is empty/
    },
    {
      name: "empty first stop",
      req: { prompt: "a", sampling: { stop: ["", "x"] } },
      reason: "invalid_argument",
      field: "sampling.stop",
      says: /stop\[0\] is empty/
    },
    {
      name: "seed above 2^64-1 (only an embedder's fromPartial can send one)",
      req: { prompt: "a", sampling: { seed: "18446744073709551616" } },
      reason: "invalid_argument",
      field: "sampling.seed",
      says: /\[0, 2\^64-1\], got 18446744073709551616/
    },
    {
      name: "seed not an integer",
      req: { prompt: "a", sampling: { seed: "-1" } },
      reason: "invalid_argument",
      field: "sampling.seed",
      says: /\[0, 2\^64-1\]/
    }
  ]
  for (const c of cases) {
    it(c.name, () => {
      const r = rejected(c.req)
      expect(r.reason).toBe(c.reason)
      expect(r.field).toBe(c.field)
      expect(r.message).toMatch(c.says)
    })
  }

  it("seed: the whole uint64 range, written to the engine digit for digit", () => {
    for (const seed of ["0", "9007199254740993", "9223372036854775808", "18446744073709551615"]) {
      const body = JSON.stringify(plan({ prompt: "a", sampling: { seed } }).body)
      expect(body).toMatch(new RegExp(`"seed":${seed}[,}]`))
    }
  })

  it("mlx's top_k off is 0 (mlx-lm refuses -1 with no response at all); every other value passes as written", () => {
    const mlx = config({}, {}, { kind: "mlx" })
    const dialect = engineFor("mlx").capabilities.requestDialect
    const planned = (topK: number) =>
      (planRequest(req({ prompt: "a", sampling: { topK } }), mlx, dialect) as RequestPlan).body
    expect(planned(-1)).toEqual({ prompt: "a", top_k: 0 })
    expect(planned(40)).toEqual({ prompt: "a", top_k: 40 })
    expect(plan({ prompt: "a", sampling: { topK: -1 } }).body).toEqual({ prompt: "a", top_k: -1 })
  })

  it("a repetition penalty the engine would refuse is refused here, naming its rule (requestDialect.ranges)", () => {
    const refusal = (kind: "llama_cpp" | "sglang" | "vllm", repetitionPenalty: number) => {
      const r = planRequest(
        req({ prompt: "a", sampling: { repetitionPenalty } }),
        config({}, {}, { kind }),
        engineFor(kind).capabilities.requestDialect
      )
      return r instanceof GenerateRejected ? [r.reason, r.message, r.field] : "taken"
    }
    // a float32 denormal: llama-server's float inverse is infinite (common_sampler_init)
    expect(refusal("llama_cpp", 1e-45)).toEqual([
      "invalid_argument",
      "sampling.repetition_penalty must be at least 2.938737e-39 and finite on llama_cpp: llama-server inverts it as a float, and refuses a penalty whose inverse is not finite; got 1e-45",
      "sampling.repetition_penalty"
    ])
    // the bound itself is taken ([min, ...)): the least float whose inverse is finite; the float below it is refused
    // (the real llama-server: 2.938736e-39 400, 2.9387373e-39 200)
    expect(refusal("llama_cpp", Math.fround(2.938737e-39))).toBe("taken")
    expect(refusal("llama_cpp", Math.fround(2.938736e-39))).not.toBe("taken")
    expect(refusal("llama_cpp", 3e-39)).toBe("taken")
    expect(refusal("llama_cpp", 3.4e38)).toBe("taken")
    // SGLang's SamplingParams.verify: (0, 2]
    expect(refusal("sglang", 2)).toBe("taken")
    expect(refusal("sglang", 2.5)).toEqual([
      "invalid_argument",
      "sampling.repetition_penalty must be in (0, 2] on sglang: SGLang's sampling parameters allow no more; got 2.5",
      "sampling.repetition_penalty"
    ])
    expect([refusal("vllm", 2.5), refusal("vllm", 1e-45)]).toEqual(["taken", "taken"])
  })

  it("llama.cpp's spelling (its backend's requestDialect): repeat_penalty, and a seed that fits its 32 bits", () => {
    const llama = config({}, {}, { kind: "llama_cpp" })
    const dialect = engineFor("llama_cpp").capabilities.requestDialect
    const planned = (p: Parameters<typeof GenerateRequest.fromPartial>[0]) => planRequest(req(p), llama, dialect)
    const body = planned({ prompt: "a", sampling: { repetitionPenalty: 1.3, seed: "4294967294" } })
    expect(body).not.toBeInstanceOf(GenerateRejected)
    expect((body as RequestPlan).body).toEqual({ prompt: "a", repeat_penalty: 1.3, seed: 4294967294 })
    for (const seed of ["4294967295", "4294967296", "18446744073709551615"]) {
      const r = planned({ prompt: "a", sampling: { seed } })
      expect(r).toBeInstanceOf(GenerateRejected)
      expect((r as GenerateRejected).message).toBe(
        `sampling.seed must be in [0, 4294967294] on llama_cpp: llama-server keeps a 32-bit seed, and 4294967295 means a random one; got ${seed}`
      )
    }
    // Every other engine but mlx (below) and SGLang's penalty range (next test): the OpenAI names, the uint64 range.
    for (const kind of ["vllm", "openai_compat"] as const)
      expect(engineFor(kind).capabilities.requestDialect, kind).toBeUndefined()
    expect(Object.keys(engineFor("sglang").capabilities.requestDialect ?? {})).toEqual(["ranges"])
    expect(plan({ prompt: "a", sampling: { repetitionPenalty: 1.3 } }).body).toEqual({
      prompt: "a",
      repetition_penalty: 1.3
    })
  })

  it("max_tokens above the model's context length", () => {
    const r = rejected({ prompt: "a", sampling: { maxTokens: 60 } }, config({}, { max_model_len: 50 }))
    expect(r.message).toMatch(/context length 50/)
  })

  it("max_tokens: one below the model's context length is accepted, the context itself refused (a prompt is a token at least)", () => {
    const c = config({}, { max_model_len: 50 })
    expect(plan({ prompt: "a", sampling: { maxTokens: 49 } }, c).body).toMatchObject({ max_tokens: 49 })
    const r = rejected({ prompt: "a", sampling: { maxTokens: 50 } }, c)
    expect(r.field).toBe("sampling.max_tokens")
    expect(r.message).toBe(
      "sampling.max_tokens 50 leaves no room for the prompt in the model's context length 50; ask for at most 49"
    )
  })

  it("penalties: both ends of -2..2 accepted, just outside either end refused (README: penalties -2..2)", () => {
    const outside = [Math.fround(-2.001), Math.fround(2.001)]
    for (const [key, name] of [
      ["presencePenalty", "presence_penalty"],
      ["frequencyPenalty", "frequency_penalty"]
    ] as const) {
      expect(plan({ prompt: "a", sampling: { [key]: -2 } }).body, key).toMatchObject({ [name]: -2 })
      expect(plan({ prompt: "a", sampling: { [key]: 2 } }).body, key).toMatchObject({ [name]: 2 })
      for (const v of outside) {
        const r = rejected({ prompt: "a", sampling: { [key]: v } })
        expect(r.field, `${key} ${v}`).toBe(`sampling.${name}`)
        expect(r.message).toMatch(/must be in -2\.\.2, got -?2\.001$/)
      }
    }
  })

  it("accepts the boundaries", () => {
    const p = plan({
      prompt: "x".repeat(64),
      sampling: { maxTokens: 100, temperature: 2, topP: 1, topK: -1, presencePenalty: -2, frequencyPenalty: 2 }
    })
    expect(p.body).toMatchObject({ max_tokens: 100, temperature: 2, top_p: 1, top_k: -1 })
  })
})

describe("planRequest: OpenAI body", () => {
  it("a prompt goes to /v1/completions; the body holds only the input and sampling fields", () => {
    const p = plan({ prompt: "hello" })
    expect(p.path).toBe("/v1/completions")
    // model, stream and stream_options are the EngineClient's, the handoff fields Handoff's
    expect(p.body).toEqual({ prompt: "hello" })
  })

  it("chat goes to /v1/chat/completions; empty model means the served one", () => {
    const p = plan({
      model: "served",
      chat: {
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content: "hi" }
        ]
      }
    })
    expect(p.path).toBe("/v1/chat/completions")
    expect(p.body.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "hi" }
    ])
  })

  it("sampling fields in OpenAI names; float32 noise removed; unset fields absent", () => {
    const p = plan({
      prompt: "a",
      sampling: {
        maxTokens: 7,
        temperature: Math.fround(0.7),
        topP: Math.fround(0.9),
        topK: 40,
        stop: ["\n"],
        seed: "42",
        presencePenalty: Math.fround(0.1),
        frequencyPenalty: Math.fround(-0.3),
        repetitionPenalty: Math.fround(1.1)
      }
    })
    expect(p.body).toEqual({
      prompt: "a",
      max_tokens: 7,
      temperature: 0.7,
      top_p: 0.9,
      top_k: 40,
      stop: ["\n"],
      seed: 42,
      presence_penalty: 0.1,
      frequency_penalty: -0.3,
      repetition_penalty: 1.1
    })
    expect(Object.keys(plan({ prompt: "a", sampling: {} }).body)).toEqual(["prompt"])
  })

  it("a float goes to the engine with all seven digits the caller wrote (float32 keeps seven)", () => {
    const p = plan({ prompt: "a", sampling: { temperature: Math.fround(0.1234567), topP: Math.fround(0.9876543) } })
    expect(p.body).toMatchObject({ temperature: 0.1234567, top_p: 0.9876543 })
  })

  it("handoff fields are not written here (planLeg writes them per leg)", () => {
    const bootstrap = { host: "h", port: 9, room: "5" }
    const decode = plan(
      { prompt: "a", kvTransferParams: { a: 1 }, bootstrap },
      config({ role: "decode" }, {}, { kv_offload: "nixl" })
    )
    expect(decode.body).toEqual({ prompt: "a" })
  })

  it("utf8Bytes counts like Buffer.byteLength", () => {
    for (const s of ["", "abc", "é", "日本語", "😀x", "\ud800"]) expect(utf8Bytes(s)).toBe(Buffer.byteLength(s))
  })
})

describe("ChunkReader", () => {
  it("chat chunks, the finish reason, then the usage chunk", () => {
    const r = new ChunkReader()
    expect(r.read({ choices: [{ index: 0, delta: { role: "assistant" } }] })).toBe("")
    expect(r.read({ choices: [{ index: 0, delta: { content: "Hel" }, finish_reason: null }] })).toBe("Hel")
    expect(r.read({ choices: [{ index: 0, delta: { content: "lo" }, finish_reason: "length" }] })).toBe("lo")
    expect(r.read({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } })).toBe("")
    const f = r.final({ ttftMs: 1, totalMs: 2, queueMs: 0, nodeId: "n", requestId: "r" })
    expect(f).toEqual({
      finishReason: "length",
      usage: { promptTokens: 3, completionTokens: 2, totalTokens: 5 },
      timings: { timeToFirstTokenMs: 1, totalMs: 2, queueMs: 0 },
      nodeId: "n",
      requestId: "r",
      stopSequence: ""
    })
  })

  it("completion chunks; without the engine's usage the final has none; no finish reason means stop", () => {
    const r = new ChunkReader()
    r.read({ choices: [{ index: 0, text: "a" }] })
    r.read({ choices: [{ index: 0, text: "" }] })
    r.read({ choices: [{ index: 0, text: "b" }] })
    const f = r.final({ ttftMs: 0, totalMs: 0, queueMs: 0, nodeId: "", requestId: "" })
    expect(f.finishReason).toBe("stop")
    // the agent has no tokenizer: no counts of its own making (a chunk is no token, the prompt it cannot count)
    expect(f.usage).toBeUndefined()
  })

  it("a chunk's kv_transfer_params never reach the final message, the prefill leg's do; tolerates junk", () => {
    const r = new ChunkReader()
    expect(r.read({ choices: "nope" as unknown as [] })).toBe("")
    r.read({ usage: null, choices: [{ text: 5 }] })
    r.read({ choices: [{ text: "", finish_reason: "length" }], kv_transfer_params: { remote_block_ids: [1] } })
    const info = { ttftMs: 0, totalMs: 0, queueMs: 0, nodeId: "", requestId: "" }
    expect(r.final(info).kvTransferParams).toBeUndefined()
    // What the prefill leg sets after Handoff.extractKvTransferParams validated the answer.
    r.kvTransferParams = { remote_block_ids: [2] }
    expect(r.final(info).kvTransferParams).toEqual({ remote_block_ids: [2] })
  })
})

describe("ChunkReader: the stop sequence the engine names", () => {
  const info = { ttftMs: 0, totalMs: 0, queueMs: 0, nodeId: "", requestId: "" }
  it("is read from the backend's field on the finishing chunk; a token id or another field is not a stop string", () => {
    const vllm = new ChunkReader("stop_reason")
    vllm.read({ choices: [{ index: 0, text: "a", finish_reason: null, stop_reason: "early" }] })
    expect(vllm.final(info).stopSequence).toBe("")
    vllm.read({ choices: [{ index: 0, text: "", finish_reason: "stop", stop_reason: "</s>" }] })
    expect(vllm.final(info).stopSequence).toBe("</s>")
    const sglang = new ChunkReader("matched_stop")
    sglang.read({ choices: [{ index: 0, text: "", finish_reason: "stop", matched_stop: 2 }] })
    expect(sglang.final(info).stopSequence).toBe("")
    sglang.read({ choices: [{ index: 0, text: "", finish_reason: "stop", stop_reason: "x" }] })
    expect(sglang.final(info).stopSequence).toBe("")
    const none = new ChunkReader()
    none.read({ choices: [{ index: 0, text: "", finish_reason: "stop", stop_reason: "x" }] })
    expect(none.final(info).stopSequence).toBe("")
  })

  it("each backend names its field: vLLM stop_reason, SGLang matched_stop, the others none", () => {
    expect(engineFor("vllm").capabilities.stopSequenceField).toBe("stop_reason")
    expect(engineFor("sglang").capabilities.stopSequenceField).toBe("matched_stop")
    for (const kind of ["llama_cpp", "mlx", "openai_compat"] as const)
      expect(engineFor(kind).capabilities.stopSequenceField, kind).toBeUndefined()
  })
})

describe("Coalescer", () => {
  it("merges pending tokens into one delta and reports room", () => {
    const c = new Coalescer(8)
    expect(c.take()).toBeUndefined()
    c.push("ab")
    c.push("cd")
    expect(c.hasRoom).toBe(true)
    expect(c.take()).toEqual({ text: "abcd", tokens: 2 })
    expect(c.take()).toBeUndefined()
  })

  it("stays bounded: no room once the cap is reached, take makes room", () => {
    const c = new Coalescer(8)
    let pushed = 0
    while (c.hasRoom) {
      c.push("xyz")
      pushed++
    }
    expect(pushed).toBe(3)
    expect(c.pendingChars).toBe(9)
    expect(c.hasRoom).toBe(false)
    expect(c.take()).toEqual({ text: "xyzxyzxyz", tokens: 3 })
    expect(c.hasRoom).toBe(true)
  })
})

describe("GrpcStatus", () => {
  it("HTTP status table", () => {
    const table: ReadonlyArray<[number, Status]> = [
      [400, Status.INVALID_ARGUMENT],
      [422, Status.INVALID_ARGUMENT],
      [404, Status.NOT_FOUND],
      [413, Status.RESOURCE_EXHAUSTED],
      [429, Status.RESOURCE_EXHAUSTED],
      [408, Status.DEADLINE_EXCEEDED],
      [500, Status.UNAVAILABLE],
      [502, Status.UNAVAILABLE],
      [503, Status.UNAVAILABLE],
      [501, Status.UNIMPLEMENTED],
      [401, Status.INTERNAL]
    ]
    for (const [http, grpc] of table)
      expect([http, statusName(httpStatusToGrpc(http))]).toEqual([http, statusName(grpc)])
  })

  it("engine errors by reason, keeping the engine's message and type", () => {
    const table: ReadonlyArray<[EngineError, Status, RegExp]> = [
      [
        new EngineError({ reason: "Http", status: 400, message: "bad temp", engineType: "BadRequestError" }),
        Status.INVALID_ARGUMENT,
        /^engine answered HTTP 400 \(BadRequestError\): bad temp$/
      ],
      [new EngineError({ reason: "Http", status: 429, message: "slow down" }), Status.RESOURCE_EXHAUSTED, /slow down/],
      [
        new EngineError({ reason: "Connect", message: "ECONNREFUSED" }),
        Status.UNAVAILABLE,
        /unreachable: ECONNREFUSED/
      ],
      [new EngineError({ reason: "Timeout", message: "headers" }), Status.DEADLINE_EXCEEDED, /in time/],
      [new EngineError({ reason: "Stream", message: "boom" }), Status.UNAVAILABLE, /mid-stream: boom/],
      [new EngineError({ reason: "Stream", status: 400, message: "bad" }), Status.INVALID_ARGUMENT, /mid-stream: bad/],
      [new EngineError({ reason: "Protocol", message: "not json" }), Status.INTERNAL, /invalid answer: not json/]
    ]
    for (const [e, code, says] of table) {
      const f = toGrpcFailure(e)
      expect(statusName(f.code)).toBe(statusName(code))
      expect(f.message).toMatch(says)
      expect(f.trailers["cgn-error-source"]).toBe("engine")
      expect(f.trailers["cgn-engine-message"]).toBe(e.message)
    }
    const t = engineFailure(new EngineError({ reason: "Http", status: 404, message: "no", engineType: "NotFound" }))
    expect(t.trailers).toMatchObject({ "cgn-engine-status": "404", "cgn-engine-type": "NotFound" })
  })

  it("agent rejections keep their code and field; an agent defect is INTERNAL", () => {
    const f = toGrpcFailure(new GenerateRejected({ reason: "model_not_served", message: "m", field: "model" }))
    expect(f).toEqual({
      code: Status.NOT_FOUND,
      message: "m",
      trailers: { "cgn-error-source": "agent", "cgn-reason": "model_not_served", "cgn-field": "model" },
      // another node may serve the model
      retryElsewhere: true
    })
    expect(toGrpcFailure(new AgentDefect({ detail: "x" }))).toMatchObject({
      code: Status.INTERNAL,
      message: "agent error: x"
    })
  })

  it("trailers are printable ASCII and bounded", () => {
    expect(asciiTrailer("é\nok")).toBe("??ok")
    expect(asciiTrailer("a".repeat(2000)).length).toBe(1024)
  })
})
