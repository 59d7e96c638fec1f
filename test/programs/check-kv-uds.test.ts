// `cgn-agent check` on kv.uds's directory (src/programs/hostChecks.ts, through layers/stateDir/stateFiles.ts
// socketDirDistrust): the link refuses a socket in a directory others may write (another local user could bind it
// first and get the KV events), so check warns when that directory exists and fails the rule; and on a socket that
// is there already and that run would refuse (socketDistrust). A warning, not a
// refusal: kvcached makes the socket later, and may fix the directory with it.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Result } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { hostFindings } from "../../src/programs/hostChecks.ts"

const dirs: Array<string> = []
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})

/** check's host findings for vLLM with KV events (on unless `events` is false) to `uds` (state_dir beside it). */
const findings = (uds: string, events = true) => {
  const state = path.join(path.dirname(uds), "state")
  const text = `[agent]\nstate_dir = "${state}"\n[kv]\nevents = ${events}\nuds = "${uds}"\n[models.m]\nhf_repo = "a/b"\n`
  const r = decodeConfig(text, "kv-uds.toml", {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  const c = r.success
  return Effect.runPromise(hostFindings(c, engineFor(c.engine.kind).render(c), { offline: false }))
}

describe("check: kv.uds's directory", () => {
  it("a 0777 directory (not sticky) is a warning (not an error) naming the key and why; a 0700 or sticky one, or none yet, is not", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-uds-"))
    dirs.push(dir)
    const uds = path.join(dir, "kvcached.sock")
    fs.chmodSync(dir, 0o777)
    const open = await findings(uds)
    expect(open.warnings).toContainEqual(
      expect.stringMatching(
        new RegExp(
          `^kv\\.uds = "${uds}": ${dir} is writable by its group and others \\(mode 0777\\); run will not connect`
        )
      )
    )
    expect(open.errors.filter((l) => l.includes("kv.uds"))).toEqual([])
    const quiet = (w: ReadonlyArray<string>) => w.filter((l) => l.startsWith("kv.uds"))
    fs.chmodSync(dir, 0o1777)
    expect(quiet((await findings(uds)).warnings)).toEqual([])
    fs.chmodSync(dir, 0o700)
    expect(quiet((await findings(uds)).warnings)).toEqual([])
    expect(quiet((await findings(path.join(dir, "not-yet", "kvcached.sock"))).warnings)).toEqual([])
  })

  it("a socket there that run would refuse (a link, not a socket) is a warning too; none yet is not", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-uds-"))
    dirs.push(dir)
    const uds = path.join(dir, "kvcached.sock")
    expect((await findings(uds)).warnings.filter((l) => l.startsWith("kv.uds"))).toEqual([])
    fs.symlinkSync(path.join(dir, "elsewhere.sock"), uds)
    expect((await findings(uds)).warnings).toContainEqual(
      `kv.uds = "${uds}": ${uds} is a symbolic link (not followed); run will not connect to it`
    )
    fs.rmSync(uds)
    fs.writeFileSync(uds, "")
    expect((await findings(uds)).warnings).toContainEqual(
      `kv.uds = "${uds}": ${uds} is not a socket; run will not connect to it`
    )
  })

  it("one warning for a socket in a directory run distrusts (the directory's); none with [kv].events off, which run never connects for", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-uds-"))
    dirs.push(dir)
    const uds = path.join(dir, "kvcached.sock")
    fs.chmodSync(dir, 0o777)
    fs.symlinkSync(path.join(dir, "elsewhere.sock"), uds)
    const kvWarnings = async (events: boolean) =>
      (await findings(uds, events)).warnings.filter((l) => l.startsWith("kv.uds"))
    expect(await kvWarnings(true)).toEqual([
      expect.stringMatching(new RegExp(`^kv\\.uds = "${uds}": ${dir} is writable by its group and others`))
    ])
    expect(await kvWarnings(false)).toEqual([])
  })
})
