// services/node/HostShortage.ts tells a failure for the lack of a file descriptor in both shapes Node gives it: an
// ErrnoException whose `code` says EMFILE or ENFILE (fs, net), or a SystemError (`code: "ERR_SYSTEM_ERROR"`) whose
// `errno` alone says it, as a positive number (os.networkInterfaces(): "Unknown system error 24") or libuv's negative
// one. Each shape and each of the two shortages (the agent's limit, the host's table) gets its own remedy: an
// operator told to raise ulimit -n when the host's file table is full raises the wrong thing.
import { describe, expect, it } from "vitest"
import { defectLine } from "../../src/programs/fatal.ts"
import { descriptorAdvice, descriptorRemedy, descriptorShortage } from "../../src/services/node/HostShortage.ts"

describe("a failure for the lack of a file descriptor", () => {
  it("is read from the code alone, for either shortage", () => {
    expect(descriptorShortage({ code: "EMFILE" })).toBe("EMFILE")
    expect(descriptorShortage({ code: "ENFILE" })).toBe("ENFILE")
  })

  it("is read from the errno alone, positive or libuv's negative, for either shortage", () => {
    expect(descriptorShortage({ code: "ERR_SYSTEM_ERROR", errno: 24 })).toBe("EMFILE")
    expect(descriptorShortage({ code: "ERR_SYSTEM_ERROR", errno: -24 })).toBe("EMFILE")
    expect(descriptorShortage({ code: "ERR_SYSTEM_ERROR", errno: 23 })).toBe("ENFILE")
    expect(descriptorShortage({ code: "ERR_SYSTEM_ERROR", errno: -23 })).toBe("ENFILE")
  })

  it("is no shortage for another error, a number in a string, or no object at all", () => {
    expect(descriptorShortage({ code: "ECONNREFUSED", errno: -111 })).toBeUndefined()
    expect(descriptorShortage({ code: "ERR_SYSTEM_ERROR", errno: "24" })).toBeUndefined()
    expect(descriptorShortage(null)).toBeUndefined()
    expect(descriptorShortage("EMFILE")).toBeUndefined()
  })

  it("a full host file table names fs.file-max, never the agent's ulimit", () => {
    expect(descriptorRemedy("ENFILE")).toBe("the host's file table is full (sysctl fs.file-max)")
    expect(descriptorRemedy("EMFILE")).toMatch(/^the agent's descriptor limit \(ulimit -n\) is too low/)
    expect(descriptorAdvice("ENFILE")).toBe(
      "ENFILE: too many open files in the system: the host's file table is full (sysctl fs.file-max)"
    )
    const table = Object.assign(new Error("ENFILE: file table overflow, open '/x'"), { code: "ENFILE", errno: -23 })
    expect(defectLine(table)).toEqual({
      msg: "ENFILE: file table overflow, open '/x': the host's file table is full (sysctl fs.file-max)"
    })
  })
})
