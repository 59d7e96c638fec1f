// agent.health_damping has no effect any more (a liveness loss ends the engine's run, so every node state reaches etcd
// at once: layers/registry/registrationStep.ts buildRecord), but a config that sets it must still start: an unknown
// key exits 2. It is accepted, and `run` (at start) and `check` warn of it (layers/config/exposureWarnings.ts), once.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Result } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { exposureWarnings, healthDampingWarning } from "../../src/layers/config/exposureWarnings.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { runCli } from "../support/cli.ts"

const load = (agent: string): AgentConfig => {
  const r = decodeConfig(`[agent]\n${agent}\n[models.m]\nhf_repo = "a/b"\n`, "damping.toml", {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

describe("agent.health_damping: accepted, without effect, warned of", () => {
  it("a config that sets it decodes, and its value is warned of once", () => {
    const c = load("health_damping = 10")
    const warning =
      "agent.health_damping = 10 has no effect any more: every node state reaches etcd as it happens (an engine's " +
      "liveness failure ends its run, a fact, not a flap); remove the key"
    expect(healthDampingWarning(c)).toBe(warning)
    expect(exposureWarnings(c).filter((w) => w.startsWith("agent.health_damping"))).toEqual([warning])
  })

  it("none where the config leaves it out; its old default, 2, set in a file is warned of too", () => {
    expect(load("").agent.health_damping).toBeUndefined()
    expect(healthDampingWarning(load(""))).toBeUndefined()
    expect(healthDampingWarning(load("health_damping = 2"))).toBe(
      "agent.health_damping = 2 has no effect any more: every node state reaches etcd as it happens (an engine's " +
        "liveness failure ends its run, a fact, not a flap); remove the key"
    )
  })

  describe("cgn-agent check", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-damping-"))
    afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

    it("exits 0 and prints the warning once", async () => {
      const dev = fs.readFileSync("examples/dev.toml", "utf8")
      const text = dev
        .replace('state_dir = ".cgn-agent/state"', `state_dir = ${JSON.stringify(path.join(dir, "state"))}`)
        .replace('log_level = "debug"', 'log_level = "debug"\nhealth_damping = 3')
      expect(text).toContain("health_damping = 3")
      const config = path.join(dir, "agent.toml")
      fs.writeFileSync(config, text)
      const r = await runCli(["check", "--config", config])
      expect(r.code, r.stderr).toBe(0)
      expect(r.stderr.split("\n").filter((l) => l.includes("health_damping"))).toEqual([
        "warning: agent.health_damping = 3 has no effect any more: every node state reaches etcd as it happens (an " +
          "engine's liveness failure ends its run, a fact, not a flap); remove the key"
      ])
    }, 40_000)
  })
})
