// The cordon's record file (layers/stateDir/durableFile.ts): replaced atomically, and durable: the new content is
// synced before the rename, the directory after the rename and after a removal. The order is what makes it
// survive a power loss, so the calls are recorded on the real file system and checked.
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type DurableFs, removeDurably, writeDurably } from "../../src/layers/stateDir/durableFile.ts"

let dir = ""
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-durable-"))
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** The real calls, each recorded as `call name` (file names relative to the test's directory); `fail` names a call that fails with EIO. */
const recording = (fail?: string) => {
  const calls: Array<string> = []
  const rel = (p: unknown) => path.relative(dir, String(p)).replace(/\.\d+\.[0-9a-f]+\.tmp$/, ".tmp") || "."
  const ops: DurableFs = {
    mkdir: ((p: string, o: unknown) => {
      calls.push(`mkdir ${rel(p)}`)
      return fsp.mkdir(p, o as fs.MakeDirectoryOptions)
    }) as DurableFs["mkdir"],
    stat: fsp.stat,
    lstat: fsp.lstat,
    open: (async (p: string, flags: string) => {
      const handle = await fsp.open(p, flags)
      const name = rel(p)
      calls.push(`open ${name}`)
      return {
        writeFile: (data: string) => {
          calls.push(`write ${name}`)
          return handle.writeFile(data)
        },
        sync: () => {
          calls.push(`sync ${name}`)
          return fail === `sync ${name}`
            ? Promise.reject(Object.assign(new Error("EIO: i/o error"), { code: "EIO" }))
            : handle.sync()
        },
        close: () => {
          calls.push(`close ${name}`)
          return handle.close()
        }
      }
    }) as unknown as DurableFs["open"],
    rename: (from, to) => {
      calls.push(`rename ${rel(from)} ${rel(to)}`)
      return fsp.rename(from, to)
    },
    rm: (p, o) => {
      calls.push(`rm ${rel(p)}`)
      return fsp.rm(p, o)
    }
  }
  return { calls, ops }
}

describe("writeDurably / removeDurably", () => {
  it("syncs the new content before the rename and the directory after it; the removal syncs the directory", async () => {
    const file = path.join(dir, "state", "cordon.json")
    const w = recording()
    await writeDurably(file, '{"since":1}', w.ops)
    expect(fs.readFileSync(file, "utf8")).toBe('{"since":1}')
    expect(w.calls).toEqual([
      "mkdir state",
      "open state/cordon.json.tmp",
      "write state/cordon.json.tmp",
      "sync state/cordon.json.tmp",
      "close state/cordon.json.tmp",
      "rename state/cordon.json.tmp state/cordon.json",
      "open state",
      "sync state",
      "close state"
    ])
    expect(fs.readdirSync(path.join(dir, "state"))).toEqual(["cordon.json"])

    const r = recording()
    await removeDurably(file, r.ops)
    expect(fs.existsSync(file)).toBe(false)
    expect(r.calls).toEqual(["rm state/cordon.json", "open state", "sync state", "close state"])
  })

  it("removes from a directory that does not exist without an error (nothing was recorded there)", async () => {
    await expect(removeDurably(path.join(dir, "absent", "cordon.json"))).resolves.toBeUndefined()
  })

  it("a write that fails before the rename throws, leaves the old record and no temp file", async () => {
    const file = path.join(dir, "failing", "cordon.json")
    await writeDurably(file, "old")
    await expect(writeDurably(file, "new", recording("sync failing/cordon.json.tmp").ops)).rejects.toThrow(/EIO/)
    expect(fs.readFileSync(file, "utf8")).toBe("old")
    expect(fs.readdirSync(path.dirname(file))).toEqual(["cordon.json"])
  })

  it("a directory that cannot be synced after the rename or removal is said, not thrown: the change happened", async () => {
    const file = path.join(dir, "unsynced", "cordon.json")
    const written = await writeDurably(file, "new", recording("sync unsynced").ops)
    expect(written).toMatch(/unsynced could not be synced \(EIO: i\/o error\): the change may not outlive a crash/)
    expect(fs.readFileSync(file, "utf8")).toBe("new")
    const removed = await removeDurably(file, recording("sync unsynced").ops)
    expect(removed).toMatch(/could not be synced/)
    expect(fs.existsSync(file)).toBe(false)
  })
})
