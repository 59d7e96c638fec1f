// What the reporter says of an etcd call's failure (src/layers/registry/etcdErrors.ts), driven directly.
import * as etcd3 from "etcd3"
import { describe, expect, it } from "vitest"
import { answeredBy, etcdAuthSays, makeFailureReasons, withTlsHint } from "../../src/layers/registry/etcdErrors.ts"

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

  it("give TLS 1.3's 'certificate required' alert the client-certificate hint", () => {
    expect(
      withTlsHint(
        "14 UNAVAILABLE: No connection established. Last error: error:0A00045C:SSL routines::tlsv13 alert certificate required"
      )
    ).toMatch(/^TLS handshake refused by etcd: it requires a client certificate/)
  })
})

describe("which etcd failures are its answer (a refusal that revokes the lease) and which got none", () => {
  const answered = answeredBy(etcd3)
  it("a lease etcd says is gone, or a permission it refuses, is its answer", () => {
    expect(answered(new etcd3.EtcdLeaseInvalidError("requested lease not found"))).toBe(true)
    expect(answered(new etcd3.EtcdPermissionDeniedError("etcdserver: permission denied"))).toBe(true)
  })
  it("an unreachable etcd, a deadline and a cancel are no answer: nothing is revoked then", () => {
    expect(answered(new etcd3.GRPCUnavailableError("14 UNAVAILABLE: No connection established"))).toBe(false)
    expect(answered(new etcd3.GRPCDeadlineExceededError("4 DEADLINE_EXCEEDED"))).toBe(false)
    expect(answered(new etcd3.GRPCCancelledError("1 CANCELLED"))).toBe(false)
  })
})
