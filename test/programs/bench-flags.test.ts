// `npm run bench`'s flags: a bad one exits 2 with the flag and the reason (no stack trace, no run started), and
// --help prints the list from bench/relay.ts's own header.
import { execFile } from "node:child_process"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../support/agent.ts"

const relay = (...args: Array<string>) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile(
      process.execPath,
      [path.join(repoRoot, "bench/relay.ts"), ...args],
      { cwd: repoRoot },
      (e, stdout, stderr) =>
        resolve({ code: e === null ? 0 : typeof e.code === "number" ? e.code : null, stdout, stderr })
    )
  })

describe("bench/relay.ts flags", () => {
  it.each([
    [["--rounds", "0"], /^bench\/relay\.ts: --rounds: expected a whole number >= 1; got "0"/],
    [["--concurrency", "1,x"], /^bench\/relay\.ts: --concurrency: expected a whole number >= 1; got "x"/],
    [["--warmup-calls=-1"], /--warmup-calls: expected a whole number >= 0; got "-1"/],
    [["--itl", "5ms,soon"], /--itl: invalid duration: soon/],
    [["--pin", "0"], /--pin: expected RELAY_CPU,ENGINE_CPU/],
    [["--direct", "fast"], /--direct: expected scan or parse; got fast/],
    [["--no-such-flag"], /Unknown option '--no-such-flag'/]
  ])("%j exits 2 with the flag and the reason", async (args, says) => {
    const r = await relay(...args)
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(says)
    expect(r.stderr).not.toMatch(/\n\s+at /)
    expect(r.stdout).toBe("")
  })

  it("--help lists the flags and runs nothing", async () => {
    const r = await relay("--help")
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/^usage: npm run bench/)
    for (const flag of ["--concurrency", "--itl", "--warmup-calls", "--agent-root", "--help"])
      expect(r.stdout).toContain(flag)
    expect(r.stdout).not.toContain("nginx version")
  })
})
