/** Pure tables: advertise address resolution, reporter timing and backoff. */
import { Duration } from "effect"
import { describe, expect, it } from "vitest"
import { resolveAdvertiseAddr } from "../../src/services/registry/Advertise.ts"
import { epochOf, nodeKey, nodesPrefix } from "../../src/services/registry/HealthReporter.ts"
import { afterLeaseLossMs, backoffMs, reporterTiming } from "../../src/services/registry/ReporterTiming.ts"

describe("Advertise.resolveAdvertiseAddr", () => {
  const interfaces = {
    lo: [{ address: "127.0.0.1", family: "IPv4", internal: true }],
    eth0: [
      { address: "fe80::1", family: "IPv6", internal: false },
      { address: "10.1.2.3", family: "IPv4", internal: false }
    ]
  }
  it.each([
    {
      name: "advertise_addr wins",
      advertiseAddr: "gpu7:7000",
      nodeIp: "10.9.9.9",
      listen: "0.0.0.0:7071",
      out: "gpu7:7000"
    },
    {
      name: "NODE_IP next, listen port",
      advertiseAddr: undefined,
      nodeIp: "10.9.9.9",
      listen: "0.0.0.0:7071",
      out: "10.9.9.9:7071"
    },
    {
      name: "IPv6 NODE_IP is bracketed",
      advertiseAddr: undefined,
      nodeIp: "fd00::5",
      listen: "[::]:7071",
      out: "[fd00::5]:7071"
    },
    {
      name: "specific listen host",
      advertiseAddr: undefined,
      nodeIp: undefined,
      listen: "127.0.0.1:7072",
      out: "127.0.0.1:7072"
    },
    { name: "first external IPv4", advertiseAddr: undefined, nodeIp: "", listen: "0.0.0.0:7071", out: "10.1.2.3:7071" }
  ])("$name", ({ advertiseAddr, nodeIp, listen, out }) => {
    expect(resolveAdvertiseAddr({ advertiseAddr, nodeIp, listenGrpc: listen, interfaces })).toBe(out)
  })
  it("falls back to loopback and uses the bound port for :0", () => {
    expect(
      resolveAdvertiseAddr({
        advertiseAddr: undefined,
        nodeIp: undefined,
        listenGrpc: "0.0.0.0:0",
        interfaces: {},
        boundPort: 40001
      })
    ).toBe("127.0.0.1:40001")
  })
})

describe("reporter timing, backoff, keys", () => {
  it.each([
    { hb: 5000, ttl: 15000, out: { heartbeatMs: 5000, ttlSeconds: 15, tickMs: 5000, callTimeoutMs: 5000 } },
    { hb: 200, ttl: 1000, out: { heartbeatMs: 200, ttlSeconds: 1, tickMs: 200, callTimeoutMs: 500 } },
    { hb: 5000, ttl: 6000, out: { heartbeatMs: 5000, ttlSeconds: 6, tickMs: 2000, callTimeoutMs: 3000 } },
    { hb: 200, ttl: 600, out: { heartbeatMs: 200, ttlSeconds: 1, tickMs: 200, callTimeoutMs: 500 } }
  ])("heartbeat $hb ms, ttl $ttl ms", ({ hb, ttl, out }) => {
    expect(reporterTiming(Duration.millis(hb), Duration.millis(ttl))).toEqual(out)
  })
  it("backoff doubles from 100 ms, is capped at one heartbeat and jittered down to half", () => {
    expect([1, 2, 3, 4, 10].map((n) => backoffMs(n, 500, 1))).toEqual([100, 200, 400, 500, 500])
    expect(backoffMs(10, 500, 0)).toBe(250)
  })
  it("a lost lease is re-granted at once; lost again before any write under it, the reporter backs off", () => {
    expect(afterLeaseLossMs(1, 500, 1)).toBe(0)
    expect([2, 3, 4, 5, 12].map((n) => afterLeaseLossMs(n, 500, 1))).toEqual([100, 200, 400, 500, 500])
    expect(afterLeaseLossMs(12, 500, 0)).toBe(250)
  })
  it("key layout and epoch", () => {
    expect(nodeKey("/cgn", "prod", "gpu-1")).toBe("/cgn/prod/nodes/gpu-1")
    expect(nodeKey("/cgn/", "prod", "gpu-1")).toBe("/cgn/prod/nodes/gpu-1")
    expect(nodesPrefix("/cgn", "prod")).toBe("/cgn/prod/nodes/")
    expect(epochOf("7587869035283627011")).toBe("694d86af72443c03")
    // agent.proto `epoch`: "The etcd lease id in hex, 16 digits (as etcdctl prints it)": leading zeros kept
    expect(epochOf(String(0x0694d86af72443c0n))).toBe("0694d86af72443c0")
    expect(epochOf("1")).toBe("0000000000000001")
  })
})
