// What the reporter says of an etcd call's failure (src/layers/registry/etcdErrors.ts), driven directly.
import { describe, expect, it } from "vitest"
import { etcdAuthSays, makeFailureReasons } from "../../src/layers/registry/etcdErrors.ts"

const untrusted = new Error(
  "14 UNAVAILABLE: No connection established. Last error: Error: self-signed certificate in certificate chain"
)
const stillDown = new Error("14 UNAVAILABLE: No connection established. Last error: null. Resolution note: ")

describe("etcd failure reasons", () => {
  it("keep a TLS cause for the calls that fail on the same dead connection with no cause of their own", () => {
    const reasonOf = makeFailureReasons()
    const first = reasonOf(untrusted)
    expect(first).toMatch(/^etcd's server certificate is not trusted \(check cluster.etcd_ca_file/)
    expect(reasonOf(stillDown)).toBe(`${first} (the connection is still down)`)
    // Anything else said ends it.
    expect(reasonOf(new Error("14 UNAVAILABLE: connect ECONNREFUSED 127.0.0.1:2379"))).toMatch(/ECONNREFUSED/)
    expect(reasonOf(stillDown)).toBe("14 UNAVAILABLE: No connection established. Last error: null.")
  })

  it("tell etcd's auth turned off or on again apart from other refusals", () => {
    expect(etcdAuthSays("etcd write failed: 9 FAILED_PRECONDITION: etcdserver: authentication is not enabled")).toBe(
      "off"
    )
    expect(etcdAuthSays("etcd write failed: 3 INVALID_ARGUMENT: etcdserver: user name is empty")).toBe("on")
    expect(etcdAuthSays("etcd write failed: 7 PERMISSION_DENIED: etcdserver: permission denied")).toBeUndefined()
  })

  it("name the [cluster] settings behind etcd's auth refusals", () => {
    const reasonOf = makeFailureReasons()
    expect(
      reasonOf(new Error("3 INVALID_ARGUMENT: etcdserver: authentication failed, invalid user ID or password"))
    ).toMatch(/\(check cluster.etcd_username and etcd_password\)$/)
    expect(reasonOf(new Error("7 PERMISSION_DENIED: etcdserver: permission denied"))).toMatch(
      /roles must grant readwrite on cluster.etcd_prefix's keys\)$/
    )
  })
})
