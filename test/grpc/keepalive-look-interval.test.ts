// How often the keepalive looks at connections (services/grpc/Keepalive.ts lookEveryMs): a quarter of the shorter
// time, at most 5 s however long the times are. keepalive.test.ts checks the quarter and the 10 ms floor. Pure.
import { describe, expect, it } from "vitest"
import { lookEveryMs } from "../../src/services/grpc/Keepalive.ts"

describe("keepalive look interval", () => {
  it("never more than 5 s apart, even with long keepalive times (a PING at most 5 s late)", () => {
    expect(lookEveryMs({ timeMs: 2 * 60 * 60_000, timeoutMs: 60_000 })).toBe(5_000)
    expect(lookEveryMs({ timeMs: 120_000, timeoutMs: 120_000 })).toBe(5_000)
    expect(lookEveryMs({ timeMs: 19_996, timeoutMs: 60_000 })).toBe(4_999)
  })
})
