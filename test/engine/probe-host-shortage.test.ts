// A probe whose connection the agent's own host could not open (src/layers/engine/probe.ts with services/node/
// HostShortage.ts) is inconclusive for every shortage HostShortage names, not only EMFILE (which host-shortage.test.ts
// meets for real): the host's file table (ENFILE), socket buffers (ENOBUFS, ENOMEM) and local ports (EADDRNOTAVAIL)
// are the agent's host too, and a liveness probe failed so would count against a sound engine. Any other transport
// error stays a failed probe. The connect failure is undici's MockAgent's (nodejs/undici lib/mock/mock-agent.js:
// replyWithError hands the error to the request's handler as a socket's would be).
import { Effect } from "effect"
import { getGlobalDispatcher, MockAgent, setGlobalDispatcher } from "undici"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import { probeOnce } from "../../src/layers/engine/probe.ts"
import { hostShortage } from "../../src/services/node/HostShortage.ts"

const ORIGIN = "http://127.0.0.1:8000"
const connectError = (code: string) =>
  Object.assign(new Error(`connect ${code} 127.0.0.1:8000 - Local (undefined:undefined)`), { code })

describe("a probe whose connection the agent's host could not open", () => {
  const previous = getGlobalDispatcher()
  let mock: MockAgent
  beforeEach(() => {
    mock = new MockAgent()
    mock.disableNetConnect()
    setGlobalDispatcher(mock)
  })
  afterEach(async () => {
    setGlobalDispatcher(previous)
    await mock.close()
  })

  const probeFailingWith = (code: string) => {
    mock.get(ORIGIN).intercept({ path: "/health", method: "GET" }).replyWithError(connectError(code))
    return Effect.runPromise(probeOnce({ kind: "http", url: `${ORIGIN}/health` }, 2_000))
  }

  it.each(["EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "EADDRNOTAVAIL"])(
    "%s: inconclusive, the shortage named",
    async (code) => {
      expect(await probeFailingWith(code)).toEqual({
        ok: false,
        reason: `${code}: ${hostShortage(code)}`,
        phase: "the agent's host is out of resources",
        inconclusive: true
      })
    }
  )

  it("another transport error is a failed probe, never inconclusive", async () => {
    const r = await probeFailingWith("ECONNRESET")
    expect(r.ok).toBe(false)
    expect(r).not.toHaveProperty("inconclusive")
    expect(r.ok === false && r.phase).toMatch(/^unreachable \(/)
  })
})
