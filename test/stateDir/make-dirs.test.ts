// `mkdir -p` that always ends (layers/stateDir/makeDirs.ts): where Node's recursive mkdir spins for ever (a path under
// procfs, a dangling symbolic link) it fails with the reason; otherwise it makes what is missing.
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type MakeDirsFs, makeDirs } from "../../src/layers/stateDir/makeDirs.ts"

let dir = ""
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-makedirs-"))
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

describe("makeDirs", () => {
  it("makes every missing level; a directory already there, or a link to one, is no error", async () => {
    const deep = path.join(dir, "a", "b", "c")
    await makeDirs(deep)
    expect(fs.statSync(deep).isDirectory()).toBe(true)
    await makeDirs(deep)
    fs.symlinkSync(path.join(dir, "a"), path.join(dir, "to-a"))
    await makeDirs(path.join(dir, "to-a", "b", "d"))
    expect(fs.statSync(path.join(dir, "a", "b", "d")).isDirectory()).toBe(true)
  })

  it("a mode is the leaf's alone (as mkdir -p -m): the parents it makes get mkdir's default", async () => {
    const calls: Array<readonly [string, unknown]> = []
    const recording: MakeDirsFs = {
      ...fsp,
      mkdir: ((p: string, options?: unknown) => {
        calls.push([p, options])
        return fsp.mkdir(p, options as fs.MakeDirectoryOptions)
      }) as MakeDirsFs["mkdir"]
    }
    const leaf = path.join(dir, "m", "n", "state")
    await makeDirs(leaf, recording, 0o700)
    const made = calls.filter(([p]) => p !== leaf).map(([p, options]) => [path.relative(dir, p), options])
    expect(made).toEqual([
      ["m/n", undefined],
      ["m", undefined],
      ["m/n", undefined]
    ])
    expect(calls.filter(([p]) => p === leaf).map(([, options]) => options)).toEqual([{ mode: 0o700 }, { mode: 0o700 }])
    expect(fs.statSync(leaf).mode & 0o777).toBe(0o700)
  })

  it("under procfs: procfs's ENOENT, at once (Node's recursive mkdir never settles there)", async () => {
    await expect(makeDirs(`/proc/cgn-makedirs-${process.pid}/state`)).rejects.toThrow(
      `ENOENT: no such file or directory, mkdir '/proc/cgn-makedirs-${process.pid}'`
    )
  })

  it("through a dangling symbolic link: says so", async () => {
    const link = path.join(dir, "dangling")
    fs.symlinkSync(path.join(dir, "nowhere"), link)
    await expect(makeDirs(path.join(link, "state"))).rejects.toThrow(`${link} is a symbolic link to a missing target`)
  })

  it("through a file: the file is named", async () => {
    const file = path.join(dir, "file")
    fs.writeFileSync(file, "")
    await expect(makeDirs(path.join(file, "state"))).rejects.toThrow(/ENOTDIR/)
    await expect(makeDirs(file)).rejects.toThrow(`${file} exists and is not a directory`)
  })
})
