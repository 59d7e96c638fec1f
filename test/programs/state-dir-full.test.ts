// A state_dir on a full filesystem: every permission check passes, so `check` said nothing and `run` died writing its
// lock with `engine process: cannot write <state_dir>/agent.lock.<uuid>: Error: ENOSPC: ...`, naming no key and
// blaming the engine. Now `check` writes (and removes) a small file in a state_dir that exists, exit 2 naming the key,
// and `run`'s fatal line names agent.state_dir, without the "engine process:" prefix. A 64 KiB tmpfs, filled; needs
// root (mount), else skipped.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { runCli } from "../support/cli.ts"

const root = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-state-full-"))
const mnt = path.join(root, "mnt")
fs.mkdirSync(mnt)
const mounted =
  process.getuid?.() === 0 &&
  spawnSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], { stdio: "ignore" }).status === 0
const stateDir = path.join(mnt, "state")
const config = path.join(root, "agent.toml")

beforeAll(() => {
  if (!mounted) return
  fs.mkdirSync(stateDir, { mode: 0o700 })
  // fill it: writes until ENOSPC
  const fd = fs.openSync(path.join(mnt, "filler"), "w")
  try {
    for (;;) fs.writeSync(fd, Buffer.alloc(4096, 1))
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOSPC") throw e
  } finally {
    fs.closeSync(fd)
  }
  fs.writeFileSync(
    config,
    [
      "[agent]",
      `state_dir = "${stateDir}"`,
      'listen_grpc = "127.0.0.1:0"',
      'listen_admin = "127.0.0.1:0"',
      "[engine]",
      'kind = "vllm"',
      `command = [${JSON.stringify(process.execPath)}, "-e", "setInterval(() => {}, 1000)"]`,
      "[models.m]",
      'hf_repo = "a/b"'
    ].join("\n")
  )
})

afterAll(() => {
  if (mounted) spawnSync("umount", [mnt], { stdio: "ignore" })
  fs.rmSync(root, { recursive: true, force: true })
})

describe.skipIf(!mounted)("a state_dir on a full filesystem", () => {
  it("check: exit 2, naming agent.state_dir and ENOSPC; its probe file is gone", async () => {
    const r = await runCli(["check", "--config", config])
    expect(r.code, r.stderr).toBe(2)
    expect(r.stderr).toContain(`agent.state_dir = "${stateDir}": ${stateDir} cannot be written (ENOSPC: no space left`)
    expect(fs.readdirSync(stateDir)).toEqual([])
  }, 40_000)

  it("run: the fatal line names agent.state_dir and ENOSPC, not 'engine process:'", async () => {
    const r = await runCli(["run", "--config", config])
    expect(r.code, r.stderr).toBe(1)
    const last = JSON.parse(r.stderr.trim().split("\n").at(-1) ?? "{}") as Record<string, unknown>
    expect(last, r.stderr).toMatchObject({ level: "fatal", exit_code: 1 })
    expect(String(last.msg)).toMatch(
      new RegExp(
        `^agent\\.state_dir = "${stateDir}": cannot write the agent's lock ${stateDir}/agent\\.lock\\.[0-9a-f-]+: ENOSPC: no space left on device`
      )
    )
    expect(String(last.msg)).not.toMatch(/engine process/)
  }, 40_000)
})
