// /readyz's text/plain reason on one line: it may carry an engine's words (NodeHealth's engine detail: the last failed
// call's message), which were written byte for byte, CR/LF, ESC sequences and NUL included, into whatever reads the
// body (a terminal, a log). They are escaped as in a JSON string (services/admin/Admin.ts oneLine).
import { Context, Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { oneLine, readiness } from "../../src/services/admin/Admin.ts"
import { NodeStatusTest, testNodeHealth } from "../../src/testing/NodeStatus.ts"
import { startAdmin } from "../support/admin.ts"

/** An engine message that would end the line, move the cursor, colour the terminal and cut a C string. */
const HOSTILE = "boom\r\nX-Injected: 1\u001b[2J\u001b]0;title\u0007\u0000tail\u009b31m\u2028end\\n"
const ESCAPED = "boom\\r\\nX-Injected: 1\\u001b[2J\\u001b]0;title\\u0007\\u0000tail\\u009b31m\\u2028end\\\\n"

const unhealthy = (detail: string) =>
  testNodeHealth({
    state: "unhealthy",
    engine: { kind: "openai_compat", model: "m", phase: "unhealthy", restarts: 0, detail }
  })

describe("oneLine", () => {
  it("escapes every control character, as a JSON string does, and keeps the rest", () => {
    expect(oneLine(HOSTILE)).toBe(ESCAPED)
    expect(oneLine("plain: é 😀 ok")).toBe("plain: é 😀 ok")
    expect(oneLine("\t\u007f\u0085")).toBe("\\t\\u007f\\u0085")
  })

  it("the readiness reason is one line", () => {
    expect(readiness(unhealthy(HOSTILE), false)).toEqual({
      ready: false,
      reason: `unhealthy (engine unhealthy: ${ESCAPED})`
    })
  })
})

describe("GET /readyz", () => {
  let admin: Awaited<ReturnType<typeof startAdmin>>
  beforeAll(async () => {
    admin = await startAdmin()
  })
  afterAll(() => admin.close())

  it("writes an engine's words with their control characters escaped", async () => {
    await Effect.runPromise(Context.get(admin.ctx, NodeStatusTest).update(() => unhealthy(HOSTILE)))
    const res = await fetch(`${admin.url}/readyz`)
    const body = Buffer.from(await res.arrayBuffer()).toString("latin1")
    expect(res.status).toBe(503)
    // no byte below 0x20 nor DEL: one line, nothing a terminal acts on
    expect([...body].filter((c) => c.charCodeAt(0) < 0x20 || c.charCodeAt(0) === 0x7f)).toEqual([])
    expect(Buffer.from(body, "latin1").toString("utf8")).toBe(`unhealthy (engine unhealthy: ${ESCAPED})`)
  })
})
