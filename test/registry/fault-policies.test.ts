// The reporter's etcd endpoint failover (src/layers/registry/faultPolicies.ts) driven directly: a host whose call
// failed on the connection is skipped while another has not failed so, and the first answer it gives clears it,
// a keepalive stream's answer as well as a unary call's.
import { EventEmitter } from "node:events"
import { describe, expect, it } from "vitest"
import { EndpointSkipped, makeHostFailover } from "../../src/layers/registry/faultPolicies.ts"

const connectionError = Object.assign(new Error("14 UNAVAILABLE: connect ECONNREFUSED"), { connection: true })
const isConnectionError = (e: unknown) => (e as { connection?: boolean }).connection === true

describe("etcd endpoint failover", () => {
  it("skips a host that failed while another has not; a keepalive stream it answers clears it", async () => {
    const policy = makeHostFailover(["a", "b"], isConnectionError)
    const [a, b] = [policy("a"), policy("b")]
    await expect(
      a.execute(() => {
        throw connectionError
      })
    ).rejects.toBe(connectionError)
    await expect(a.execute(() => "unary")).rejects.toBeInstanceOf(EndpointSkipped)
    expect(await b.execute(() => "unary")).toBe("unary")
    // Every host failed (an election): all are tried again.
    await expect(
      b.execute(() => {
        throw connectionError
      })
    ).rejects.toBe(connectionError)
    const stream = Object.assign(new EventEmitter(), { on: EventEmitter.prototype.on })
    expect(await a.execute(() => stream)).toBe(stream)
    // Opened, not answered: a still counts as failed (b too, so both are tried).
    expect(await b.execute(() => "unary")).toBe("unary")
    await expect(a.execute(() => "unary")).rejects.toBeInstanceOf(EndpointSkipped)
    // b failed again, then a's keepalive answered: a is cleared, so b is skipped.
    await expect(
      b.execute(() => {
        throw connectionError
      })
    ).rejects.toBe(connectionError)
    stream.emit("data", { TTL: "3" })
    await expect(b.execute(() => "unary")).rejects.toBeInstanceOf(EndpointSkipped)
    expect(await a.execute(() => "unary")).toBe("unary")
  })
})
