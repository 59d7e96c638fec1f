// Host and port as the config writes them: one module for every listen and advertise key.
import { describe, expect, it } from "vitest"
import {
  canonicalHost,
  hostOfAddr,
  isLoopbackHost,
  isWildcardHost,
  joinHostPort,
  splitHostPort,
  unbracket
} from "../../src/services/net/HostPort.ts"
import { resolveAdvertiseAddr } from "../../src/services/registry/Advertise.ts"

describe("HostPort", () => {
  it("splits and joins, IPv6 in brackets", () => {
    expect(splitHostPort("[::1]:7071")).toEqual({ host: "[::1]", port: "7071" })
    expect(splitHostPort("10.0.0.1:80")).toEqual({ host: "10.0.0.1", port: "80" })
    expect(joinHostPort("::1", 7071)).toBe("[::1]:7071")
    expect(joinHostPort("[::1]", "7071")).toBe("[::1]:7071")
    expect(unbracket("[fe80::1]")).toBe("fe80::1")
    expect(hostOfAddr("[::1]:7071")).toBe("::1")
    expect(hostOfAddr("node-a.example:7071")).toBe("node-a.example")
  })

  it("loopback: 127/8, ::1 in any spelling, ::ffff:127.x, localhost in any case or with the root's dot; nothing else", () => {
    for (const h of [
      "127.0.0.1",
      "127.9.8.7",
      "::1",
      "[::1]",
      "0:0:0:0:0:0:0:1",
      "::ffff:127.0.0.1",
      "LOCALHOST",
      // the root's dot: the resolver binds "localhost." as "localhost"
      "localhost.",
      "127.0.0.1."
    ])
      expect(isLoopbackHost(h), h).toBe(true)
    for (const h of ["0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "localhost.example", "::ffff:10.0.0.1"])
      expect(isLoopbackHost(h), h).toBe(false)
  })

  it("wildcards in their canonical form: '0' and '[0:0::0]' are wildcards too", () => {
    for (const h of ["0.0.0.0", "0", "::", "[::]", "[0:0::0]", ""]) expect(isWildcardHost(h), h).toBe(true)
    expect(isWildcardHost("127.0.0.1")).toBe(false)
    expect(canonicalHost("127.1")).toBe("127.0.0.1")
  })

  it("an advertised address never names a wildcard host", () => {
    const input = { advertiseAddr: undefined, nodeIp: undefined, boundPort: undefined }
    const interfaces = { eth0: [{ address: "10.1.2.3", family: "IPv4", internal: false }] }
    expect(resolveAdvertiseAddr({ ...input, listenGrpc: "0:7071", interfaces })).toBe("10.1.2.3:7071")
    expect(resolveAdvertiseAddr({ ...input, listenGrpc: "127.0.0.1:7071", interfaces })).toBe("127.0.0.1:7071")
  })
})
