// The bound on what a call's status carries (services/grpc/StatusMessage.ts): grpc-message cut to 1 KiB as sent,
// between characters, with a marker saying how much was cut; a caller's value quoted short in the messages that name
// it; and the agent's largest status within the 8 KiB header list the strictest gRPC clients take.
import { Result } from "effect"
import { Status } from "nice-grpc-common"
import { describe, expect, it } from "vitest"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import { GenerateRejected, planRequest } from "../../src/services/grpc/Generate.ts"
import { engineFailure, type GrpcFailure, rejectedFailure } from "../../src/services/grpc/GrpcStatus.ts"
import {
  asSent,
  boundStatusMessage,
  characters,
  MAX_STATUS_MESSAGE_BYTES,
  PAIR_ADVICE,
  QUOTED_CHARS,
  quoteInput,
  RETRY_ADVICE,
  STREAMED_ADVICE,
  statusTrailers
} from "../../src/services/grpc/StatusMessage.ts"
import { UnknownMethod, UnsupportedEncoding } from "../../src/services/grpc/TransportErrors.ts"
import { encodeStatusMessage } from "../../src/services/grpc/Wire.ts"

const MAX = MAX_STATUS_MESSAGE_BYTES
/** What a client reads (grpc-js: decodeURI, src/subchannel-call.ts; the same here, where nothing reserved is escaped). */
const decode = (wire: string): string => decodeURIComponent(wire)
const MARKER = /… \((\d+) more characters\)$/
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** Checks a cut: within the bound, decodable, a prefix of `message` then the marker, the counts adding up. */
const expectCut = (message: string, maxBytes = MAX): string => {
  const wire = boundStatusMessage(message, maxBytes)
  expect(wire.length).toBeLessThanOrEqual(maxBytes)
  expect(wire).toMatch(/^[\x20-\x7e]*$/)
  const text = decode(wire) // throws on a broken %XX escape
  const m = MARKER.exec(text)
  expect(m).not.toBeNull()
  const kept = text.slice(0, m!.index)
  expect(LONE_SURROGATE.test(kept)).toBe(false)
  expect(message.startsWith(kept)).toBe(true)
  expect(characters(kept) + Number(m![1])).toBe(characters(message))
  return kept
}

describe("boundStatusMessage", () => {
  it("sends a message that fits as encodeStatusMessage does, whole", () => {
    for (const m of ["", "plain", "100% sure", "naïve: é, 中文, 😀", "a\nb"])
      expect(boundStatusMessage(m)).toBe(encodeStatusMessage(m))
  })

  it("keeps a message of exactly the limit whole and cuts one byte over", () => {
    expect(boundStatusMessage("a".repeat(MAX))).toBe("a".repeat(MAX))
    // 1018 + one "é" (%C3%A9, 6 bytes) = 1024 exactly.
    expect(boundStatusMessage(`${"a".repeat(MAX - 6)}é`)).toBe(`${"a".repeat(MAX - 6)}%C3%A9`)
    const kept = expectCut("a".repeat(MAX + 1))
    expect(kept).toBe("a".repeat(kept.length))
    expect(boundStatusMessage("a".repeat(MAX + 1))).toMatch(/%E2%80%A6 \(\d+ more characters\)$/)
  })

  it("cuts a 120k-character message to the bound and counts the rest", () => {
    const m = `model "M${"x".repeat(120_000)}" is not served here`
    const kept = expectCut(m)
    expect(kept.length).toBeGreaterThan(MAX - 40)
  })

  it("never cuts inside a percent-escape: '%' and non-ASCII at every offset around the limit", () => {
    for (const ch of ["%", "é", "中", "\u0001"])
      for (let pad = 0; pad < 12; pad++) expectCut(`${"a".repeat(pad)}${ch.repeat(MAX)}`)
    const kept = expectCut("é".repeat(25_000)) // the finding's 50 KB role, 150 KB once encoded
    expect(kept).toBe("é".repeat(kept.length))
  })

  it("never splits a surrogate pair, at every offset around the limit", () => {
    for (let pad = 0; pad < 14; pad++) {
      const kept = expectCut(`${"a".repeat(pad)}${"😀".repeat(MAX)}`)
      expect(kept.length % 2).toBe(pad % 2) // whole pairs only
    }
  })

  it("counts a lone surrogate as the U+FFFD it is sent as (9 bytes) and stays within the bound", () => {
    const m = "\ud800".repeat(200) // 200 * 9 = 1800 bytes once encoded
    const wire = boundStatusMessage(m)
    expect(wire.length).toBeLessThanOrEqual(MAX)
    expect(decode(wire)).toMatch(/^\ufffd+… \(\d+ more characters\)$/)
    expect(boundStatusMessage("\ud800".repeat(113))).toBe("%EF%BF%BD".repeat(113)) // 1017 bytes: fits
  })

  it("takes a smaller bound", () => {
    expect(expectCut("x".repeat(500), 100).length).toBeGreaterThan(60)
  })
})

describe("quoteInput", () => {
  it("quotes a short value whole, JSON-style, non-ASCII and control characters as escapes", () => {
    expect(quoteInput("m")).toBe('"m"')
    expect(quoteInput('a"b\\c')).toBe('"a\\"b\\\\c"')
    expect(quoteInput("é\n\u200b")).toBe('"\\u00e9\\n\\u200b"')
    expect(quoteInput("😀")).toBe('"\\ud83d\\ude00"')
    // DEL (0x7f) is a control character too: JSON.stringify leaves it raw
    expect(quoteInput("a\x7fb")).toBe('"a\\u007fb"')
  })

  it("shows the first characters of a long value and its length", () => {
    expect(quoteInput(`M${"x".repeat(120_000)}`)).toBe(`"M${"x".repeat(QUOTED_CHARS - 1)}"... (120001 characters)`)
    expect(quoteInput("a".repeat(QUOTED_CHARS))).toBe(`"${"a".repeat(QUOTED_CHARS)}"`)
    // One character over is cut, and says so.
    expect(quoteInput("a".repeat(QUOTED_CHARS + 1))).toBe(
      `"${"a".repeat(QUOTED_CHARS)}"... (${QUOTED_CHARS + 1} characters)`
    )
    // Character 64 is a pair: shown whole, never half.
    expect(quoteInput(`${"a".repeat(QUOTED_CHARS - 1)}😀zz`)).toBe(
      `"${"a".repeat(QUOTED_CHARS - 1)}\\ud83d\\ude00"... (66 characters)`
    )
  })
})

describe("planRequest quotes a caller's value short, naming the field", () => {
  const decoded = decodeConfigObject(
    { agent: { node_id: "n1" }, engine: {}, models: { m: { hf_repo: "org/m", served_name: "served" } } },
    undefined,
    {}
  )
  if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
  const cfg = decoded.success
  const rejected = (p: Parameters<typeof GenerateRequest.fromPartial>[0]): GenerateRejected => {
    const r = planRequest(GenerateRequest.fromPartial(p), cfg)
    if (!(r instanceof GenerateRejected)) throw new Error("expected a rejection")
    return r
  }

  it("a 120k-character model name", () => {
    const r = rejected({ model: `M${"x".repeat(120_000)}`, prompt: "a" })
    expect([r.reason, r.field]).toEqual(["model_not_served", "model"])
    expect(r.message).toBe(
      `model "M${"x".repeat(QUOTED_CHARS - 1)}"... (120001 characters) is not served here; this node serves "served"`
    )
  })

  it("a 25k-character non-ASCII role", () => {
    const r = rejected({ chat: { messages: [{ role: "é".repeat(25_000), content: "hi" }] } })
    expect([r.reason, r.field]).toEqual(["invalid_argument", "chat.messages[0].role"])
    expect(r.message).toBe(
      `chat.messages[0].role "${"\\u00e9".repeat(QUOTED_CHARS)}"... (25000 characters) is not one of system, user, assistant, tool, developer`
    )
    expect(encodeStatusMessage(r.message)).toBe(r.message) // ASCII: no percent-encoding blow-up
  })

  it("a bad request id and seed", () => {
    expect(rejected({ requestId: "\u0000".repeat(300), prompt: "a" }).message).toMatch(
      /got "(\\u0000){64}"\.\.\. \(300 characters\)$/
    )
    expect(rejected({ prompt: "a", sampling: { seed: "9".repeat(500), stop: [] } }).message).toMatch(
      /got "9{64}"\.\.\. \(500 characters\)$/
    )
  })
})

/** A header list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 section 6.5.2). */
const listSize = (headers: Record<string, string>): number =>
  Object.entries(headers).reduce((n, [k, v]) => n + k.length + v.length + 32, 0)

// The advice a message ends with is decided where cgn-retryable is (asSent), from the same inputs: the failure's own
// message carries none, so no wording of it can escape the decision and contradict the trailer.
describe("asSent: the retry advice, decided with cgn-retryable", () => {
  const busy: GrpcFailure = {
    code: Status.UNAVAILABLE,
    message: "node is busy",
    trailers: {},
    retryElsewhere: true,
    advised: true
  }

  it("a message without advice gets the one that agrees with cgn-retryable, by what went out and the pair alone", () => {
    expect(RETRY_ADVICE).toBe("; retry on another node")
    expect(asSent(busy, false)).toEqual({ message: "node is busy; retry on another node", retryable: true })
    expect(asSent(busy, true)).toEqual({ message: `node is busy${STREAMED_ADVICE}`, retryable: false })
    const bound = { ...busy, pairBound: true as const }
    expect(asSent(bound, false)).toEqual({ message: `node is busy${PAIR_ADVICE}`, retryable: false, retryPair: true })
    // once it wrote, the pair is no longer the question: a client has text
    expect(asSent(bound, true)).toEqual(asSent(busy, true))
    expect(statusTrailers(busy, false)).toMatchObject({
      "grpc-message": "node is busy; retry on another node",
      "cgn-retryable": "true"
    })
  })

  it("a row without the advice, or a failure not retryable elsewhere, keeps its words; the trailers are the same", () => {
    const { advised: _, ...quiet } = busy
    for (const wrote of [false, true])
      for (const pairBound of [undefined, true] as const) {
        const f = pairBound === undefined ? quiet : { ...quiet, pairBound }
        const advisedAs = asSent(pairBound === undefined ? busy : { ...busy, pairBound }, wrote)
        expect(asSent(f, wrote)).toEqual({ ...advisedAs, message: "node is busy" })
      }
    expect(asSent({ ...busy, retryElsewhere: false }, false)).toEqual({ message: "node is busy", retryable: false })
    const { retryElsewhere: __, ...noOpinion } = busy
    expect(asSent(noOpinion, false)).toEqual({ message: "node is busy", retryable: undefined })
  })
})

describe("statusTrailers", () => {
  it("keeps the agent's largest status, trailers-only, within the 8 KiB the strictest clients take", () => {
    const huge = "中".repeat(100_000)
    const f = engineFailure(
      new EngineError({ reason: "Http", status: 400, message: huge, engineType: huge, engineCode: huge })
    )
    const trailers = statusTrailers(f, false)
    expect(trailers["grpc-message"]!.length).toBeLessThanOrEqual(MAX)
    for (const k of ["cgn-engine-message", "cgn-engine-type", "cgn-engine-code"])
      expect(trailers[k]!.length).toBeLessThanOrEqual(1024)
    const trailersOnly = {
      ":status": "200",
      "content-type": "application/grpc",
      "grpc-accept-encoding": "identity,deflate,gzip",
      ...trailers
    }
    expect(listSize(trailersOnly)).toBeLessThan(5 * 1024)
  })

  it("writes code, message, the row's trailers in printable ASCII, and cgn-retryable", () => {
    const f = rejectedFailure(new GenerateRejected({ reason: "model_not_served", message: "model é", field: "model" }))
    expect(
      statusTrailers({ ...f, trailers: { ...f.trailers, "grpc-status": "0", "x-odd": "a\u00e9\nb" } }, false)
    ).toEqual({
      "grpc-status": String(Status.NOT_FOUND),
      "grpc-message": "model %C3%A9",
      "cgn-error-source": "agent",
      "cgn-reason": "model_not_served",
      "cgn-field": "model",
      "x-odd": "a??b",
      "cgn-retryable": "true"
    })
    expect(statusTrailers({ code: Status.OK, message: "", trailers: {} }, true)).toEqual({ "grpc-status": "0" })
  })

  it("a leg bound to its pair tells a gRPC retry policy not to retry (grpc-retry-pushback-ms -1); nothing else does", () => {
    const pushback = (f: GrpcFailure, wrote: boolean) => statusTrailers(f, wrote)["grpc-retry-pushback-ms"]
    const elsewhere = rejectedFailure(new GenerateRejected({ reason: "model_not_served", message: "m" }))
    const invalid = rejectedFailure(new GenerateRejected({ reason: "invalid_argument", message: "m" }))
    expect(pushback({ ...elsewhere, pairBound: true }, false)).toBe("-1")
    // retryable: the policy's own backoff decides; a library's status: no opinion
    expect(pushback(elsewhere, false)).toBeUndefined()
    expect(pushback({ code: Status.UNKNOWN, message: "", trailers: {} }, false)).toBeUndefined()
    // the request's fault: a pushback would count against the router's retry throttling (gRFC A6); output sent: the
    // call is committed, no library retries it; a pair-bound leg that streamed is no longer the pair's to retry
    expect(pushback(invalid, false)).toBeUndefined()
    expect(pushback(elsewhere, true)).toBeUndefined()
    expect(pushback({ ...elsewhere, pairBound: true }, true)).toBeUndefined()
  })
})

describe("header values a transport error quotes (the caller's too)", () => {
  it("an ordinary method path as grpc-js words it; a long or unprintable one quoted shortened", () => {
    expect(new UnknownMethod({ path: "/a.B/C" }).message).toBe("the server does not implement the method /a.B/C")
    const long = `/${"x".repeat(40_000)}`
    expect(new UnknownMethod({ path: long }).message).toBe(
      `the server does not implement the method "/${"x".repeat(63)}"... (40001 characters)`
    )
    // 64 printable characters as they are; 65, or a space (unquoted, it would blur where the path ends), quoted
    const path64 = `/${"x".repeat(63)}`
    expect(new UnknownMethod({ path: path64 }).message).toBe(`the server does not implement the method ${path64}`)
    expect(new UnknownMethod({ path: `${path64}y` }).message).toBe(
      `the server does not implement the method "${path64}"... (65 characters)`
    )
    expect(new UnknownMethod({ path: "/a b" }).message).toBe('the server does not implement the method "/a b"')
    expect(new UnknownMethod({ path: "/a b\u0085" }).message).toBe(
      'the server does not implement the method "/a b\\u0085"'
    )
  })

  it("an encoding quoted shortened, control and non-ASCII characters escaped", () => {
    expect(new UnsupportedEncoding({ encoding: "br%\u00ff\u0080" }).message).toBe(
      'message compressed with "br%\\u00ff\\u0080", which this server does not decode (identity, gzip, deflate)'
    )
  })
})
