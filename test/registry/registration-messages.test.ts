/**
 * The words and keys of services/registry/HealthReporter.ts that an operator reads or a router watches: the node key
 * under any spelling of the prefix, and the registration errors' messages for each kind of holder. Pure: no etcd
 * (health-reporter.test.ts meets these against a real one).
 */
import { describe, expect, it } from "vitest"
import { LeaseLost, nodeKey, nodesPrefix, RegistrationConflict } from "../../src/services/registry/HealthReporter.ts"

const conflict = (holderLease: string, holderAdvertiseAddr: string, holderIsThisAddress: boolean) =>
  new RegistrationConflict({
    key: "/cgn/c/nodes/n1",
    nodeId: "n1",
    holderLease,
    holderAdvertiseAddr,
    holderIsThisAddress
  })

describe("registration keys and messages", () => {
  it("puts the node key under the prefix a router watches, however many slashes end the prefix", () => {
    for (const prefix of ["/cgn", "/cgn/", "/cgn//"]) {
      expect(nodeKey(prefix, "c", "n1")).toBe("/cgn/c/nodes/n1")
      expect(nodeKey(prefix, "c", "n1").startsWith(nodesPrefix(prefix, "c"))).toBe(true)
    }
  })

  it("says a lease id it cannot read is unknown, rather than failing to say anything", () => {
    // epochOf takes etcd's decimal id; anything else (an id the error carries as some other text) must not throw
    // from inside the message getter, where a log line or a /status render would lose the error itself.
    expect(new LeaseLost({ leaseId: "not-a-lease", reason: "expired" }).message).toBe(
      "etcd lease (unknown) lost: expired"
    )
    expect(new LeaseLost({ leaseId: "255", reason: "expired" }).message).toBe(
      "etcd lease 00000000000000ff lost: expired"
    )
  })

  it("tells a key written without a lease apart from this node's previous agent, even at this node's address", () => {
    // A key with no lease never expires: waiting for "that lease" to end, as for a killed agent's, would be wrong.
    const noLease = conflict("none", "10.0.0.1:7000", true).message
    expect(noLease).toContain("with no lease")
    expect(noLease).toContain("etcdctl del /cgn/c/nodes/n1")
    expect(noLease).not.toContain("previous agent")
    expect(conflict("00000000000000ff", "10.0.0.1:7000", true).message).toContain(
      "most likely this node's previous agent"
    )
  })

  it("says the holder's address is unknown when its record gave none", () => {
    expect(conflict("00000000000000ff", "", false).message).toContain("(lease 00000000000000ff, unknown address)")
    expect(conflict("00000000000000ff", "10.0.0.2:7000", false).message).toContain(
      "(lease 00000000000000ff, advertising 10.0.0.2:7000)"
    )
  })
})
