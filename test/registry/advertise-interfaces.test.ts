// The advertised address lists this host's interfaces only when the listen host is a wildcard and nothing else decides
// it: listing them opens a socket, which fails with no descriptor left (`os.networkInterfaces()` threw
// `uv_interface_addresses returned Unknown system error 24` for 127.0.0.1:0 and ended `run` on a defect). Where they
// are needed and cannot be listed, the failure names the key and the cause in the agent's words.
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { defectLine } from "../../src/programs/fatal.ts"
import { AdvertiseError, advertiseAddrOf, resolveAdvertiseAddr } from "../../src/services/registry/Advertise.ts"

// The shape Node 24 throws from os.networkInterfaces() at EMFILE (ERR_SYSTEM_ERROR, libuv's errno unnamed).
const emfile = () =>
  Object.assign(new Error("A system error occurred: uv_interface_addresses returned Unknown system error 24"), {
    code: "ERR_SYSTEM_ERROR",
    errno: 24,
    syscall: "uv_interface_addresses"
  })

const input = { advertiseAddr: undefined, nodeIp: undefined }

describe("the advertised address and the host's interfaces", () => {
  it("a specific listen host, advertise_addr or NODE_IP: the interfaces are never listed", () => {
    let asked = 0
    const list = () => {
      asked++
      throw emfile()
    }
    const cases: Array<[Parameters<typeof resolveAdvertiseAddr>[0], string]> = [
      [{ ...input, listenGrpc: "127.0.0.1:0", boundPort: 4242, interfaces: list }, "127.0.0.1:4242"],
      [{ ...input, listenGrpc: "[::1]:7071", interfaces: list }, "[::1]:7071"],
      [{ ...input, listenGrpc: "0.0.0.0:7071", advertiseAddr: "a.example:1", interfaces: list }, "a.example:1"],
      [{ ...input, listenGrpc: "0.0.0.0:7071", nodeIp: "10.0.0.9", interfaces: list }, "10.0.0.9:7071"]
    ]
    for (const [i, out] of cases) expect(resolveAdvertiseAddr(i)).toBe(out)
    expect(Effect.runSync(advertiseAddrOf({ ...input, listenGrpc: "127.0.0.1:7071" }, list))).toBe("127.0.0.1:7071")
    expect(asked).toBe(0)
  })

  it("a wildcard listen host lists them once, for the first external IPv4", () => {
    let asked = 0
    const list = () => {
      asked++
      return {
        lo: [{ address: "127.0.0.1", family: "IPv4", internal: true }],
        eth0: [{ address: "10.1.2.3", family: 4, internal: false }]
      }
    }
    expect(Effect.runSync(advertiseAddrOf({ ...input, listenGrpc: "0.0.0.0:7071" }, list))).toBe("10.1.2.3:7071")
    expect(asked).toBe(1)
  })

  it("a wildcard host with no descriptor left: an AdvertiseError naming the key, EMFILE and the limit", () => {
    const exit = Effect.runSyncExit(
      advertiseAddrOf({ ...input, listenGrpc: "0.0.0.0:7071" }, () => {
        throw emfile()
      })
    )
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
    expect(error?._tag).toBe("Fail")
    const e = error?._tag === "Fail" ? error.error : undefined
    expect(e).toBeInstanceOf(AdvertiseError)
    expect(e?.message).toMatch(/^agent\.listen_grpc: cannot list this host's network interfaces/)
    expect(e?.message).toMatch(/EMFILE: too many open files: the agent's descriptor limit \(ulimit -n\) is too low/)
    expect(e?.message).not.toMatch(/Unknown system error/)
  })

  it("a defect for the lack of a descriptor is told without a stack; any other is an internal error with one", () => {
    const open = Object.assign(new Error("EMFILE: too many open files, open '/x.proto'"), {
      code: "EMFILE",
      errno: -24
    })
    expect(defectLine(open)).toEqual({
      msg: "EMFILE: too many open files, open '/x.proto': the agent's descriptor limit (ulimit -n) is too low; raise it (systemd LimitNOFILE, the container's nofile ulimit)"
    })
    const bug = defectLine(new TypeError("x is undefined"))
    expect(bug.msg).toBe("internal error (a defect of the agent's): x is undefined")
    expect(bug.stack).toMatch(/TypeError: x is undefined\n\s+at /)
  })
})
