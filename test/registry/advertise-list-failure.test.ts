// When the host's interfaces cannot be listed for the advertised address (services/registry/Advertise.ts), and the
// cause is not a descriptor shortage, the AdvertiseError says the listen host that made them needed and the error's
// own message, not "Error: ..." (an Error's String()) nor the descriptor remedy.
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { AdvertiseError, advertiseAddrOf } from "../../src/services/registry/Advertise.ts"

const failureOf = (listenGrpc: string, thrown: unknown) => {
  const exit = Effect.runSyncExit(
    advertiseAddrOf({ advertiseAddr: undefined, nodeIp: undefined, listenGrpc }, () => {
      throw thrown
    })
  )
  const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
  return reason?._tag === "Fail" ? reason.error : undefined
}

describe("interfaces that cannot be listed for another reason", () => {
  it("an Error: its message, after the key and the wildcard listen host", () => {
    const e = failureOf("0.0.0.0:7071", new Error("uv_interface_addresses returned EPERM"))
    expect(e).toBeInstanceOf(AdvertiseError)
    expect(e?.message).toBe(
      "agent.listen_grpc: cannot list this host's network interfaces for the address to advertise (listen host 0.0.0.0 is a wildcard; agent.advertise_addr or NODE_IP would decide it instead): uv_interface_addresses returned EPERM"
    )
  })

  it("names the listen host as written, an IPv6 wildcard too; a thrown non-Error as its string", () => {
    const e = failureOf("[::]:7071", "no interfaces")
    expect(e?.message).toMatch(/\(listen host \[::\] is a wildcard; /)
    expect(e?.message).toMatch(/would decide it instead\): no interfaces$/)
  })
})
