// What handoff.test.ts left open in SGLang's rendezvous check (services/grpc/SglangBootstrap.ts checkBootstrap), found
// by a mutation audit: which values count as absent and which as wrong, the bracketed IPv6 form taken only whole, the
// port's range at its top and its integrality, and how a hostile host is quoted. Upstream: SGLang's decode engine
// dials `http://{bootstrap_host}:{bootstrap_port}/route` (sgl-project/sglang python/sglang/srt/disaggregation/common/
// conn.py, CommonKVReceiver) and takes bootstrap_room as an integer (python/sglang/srt/entrypoints/openai/protocol.py).
import { describe, expect, it } from "vitest"
import { type BootstrapInput, checkBootstrap } from "../../src/services/grpc/SglangBootstrap.ts"

const ok: BootstrapInput = { host: "10.0.0.7", port: 8998, room: 42 }

const problemsOf = (input: BootstrapInput) => {
  const r = checkBootstrap(input)
  return r._tag === "Problems" ? { problems: r.problems, missing: r.missing } : "accepted"
}

describe("absent, not wrong: what proto leaves unset is named missing, and only that", () => {
  it("a host of spaces only is a missing host (no 'must be a host name' beside it)", () => {
    expect(problemsOf({ ...ok, host: "   " })).toEqual({ problems: [], missing: ["bootstrap.host"] })
    expect(problemsOf({ ...ok, host: "\t" })).toEqual({ problems: [], missing: ["bootstrap.host"] })
  })

  it("port 0 (proto's unset) is a missing port, not also 'must be in 1..65535'", () => {
    expect(problemsOf({ ...ok, port: 0 })).toEqual({ problems: [], missing: ["bootstrap.port"] })
  })
})

describe("the host as the decode engine dials it", () => {
  // A router that copied the address out of a URL may bracket an IPv6 host; what surrounds the brackets (a port, a
  // path, a prefix) would be dialled as part of the host.
  it.each([
    ["a bracketed IPv6 host with a port after it", "[fd00::7]:8998"],
    ["a bracketed IPv6 host with a path after it", "[fd00::7]/route"],
    ["text before a bracketed IPv6 host", "p[fd00::7]"]
  ])("%s is refused", (_name, host) => {
    expect(problemsOf({ ...ok, host })).toEqual({
      problems: [`bootstrap.host must be a host name or IP address, got ${JSON.stringify(host)}`],
      missing: []
    })
  })

  it("a long hostile host is quoted to its first 40 characters and its length, escapes visible", () => {
    const host = `a\r\n${"x".repeat(97)}`
    expect(problemsOf({ ...ok, host })).toEqual({
      problems: [
        `bootstrap.host must be a host name or IP address, got "a\\r\\n${"x".repeat(37)}"... (100 characters)`
      ],
      missing: []
    })
  })
})

describe("the port: an integer in 1..65535, both ends taken", () => {
  it.each([1, 65535])("port %d is taken", (port) => {
    expect(checkBootstrap({ ...ok, port })).toEqual({ _tag: "Bootstrap", bootstrap: { ...ok, port, room: 42n } })
  })

  it.each([65536, 8998.5, Number.NaN])("port %d is refused, naming it", (port) => {
    expect(problemsOf({ ...ok, port })).toEqual({
      problems: [`bootstrap.port must be in 1..65535, got ${port}`],
      missing: []
    })
  })
})

describe("the room", () => {
  it("an empty string is no room (not room 0, which another pair may be using)", () => {
    expect(problemsOf({ ...ok, room: "" })).toEqual({
      problems: ["bootstrap.room must be an exact integer in [0, 2^63-1], got "],
      missing: []
    })
  })
})
