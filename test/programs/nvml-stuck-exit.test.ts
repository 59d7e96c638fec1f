// A GPU off the bus hangs NVML calls: the built agent (dist/main.js) with the fake libnvidia-ml.so
// (CGN_NVML_LIBRARY) whose calls block while FAKE_NVML_BLOCK_FILE exists. A scrape waits out the call's deadline
// (no GPUs, nvml_up 0), and on SIGTERM the agent drains, says the NVML worker is still inside its call, and exits
// 0 while that call still hangs (layers/node/processExit.ts); process.exit() would have waited for the call.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { runCli } from "../support/cli.ts"
import { useFakeNvml } from "../support/nvml.ts"

const nvml = useFakeNvml("cgn-nvml-exit-")
beforeAll(() => {
  requireDist()
})
afterEach(async () => {
  // unblock first: a worker left inside the call holds nothing of the test, but its process must end too
  fs.rmSync(path.join(nvml.dir, "block"), { force: true })
  await killAllAgents()
})

describe("an NVML call that never returns (built agent, fake NVML)", () => {
  it("does not hold the agent's exit after a drain", async () => {
    const block = path.join(nvml.dir, "block")
    // GPUs free enough for the engine to start on (the fake's GPUs hold 20 GiB otherwise)
    const state = path.join(nvml.dir, "state")
    fs.writeFileSync(state, "gpu.0.used=268435456\ngpu.1.used=268435456\n")
    const { config } = await simAgentConfig({ agent: { drain_timeout: "1s" } })
    const agent = await startAgent({
      config,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_BLOCK_FILE: block, FAKE_NVML_STATE: state }
    })
    const scrape = async () => (await fetch(`${agent.adminUrl}/metrics`)).text()
    expect(await scrape()).toMatch(/^cgn_agent_nvml_up 1$/m)

    // from now on every NVML call hangs; the scrape after the cached sample waits out the call's deadline (10 s)
    fs.writeFileSync(block, "")
    void scrape().catch(() => undefined)
    await agent.waitForLine((l) => l.includes("NVML call stuck"), 60_000)
    const exit = await agent.stop("SIGTERM", 60_000)
    expect(exit).toEqual({ code: 0, signal: null })
    // the call was still hanging when the process ended
    expect(fs.existsSync(block)).toBe(true)
    expect(
      agent.logs().some((l) => l.msg === "NVML worker still inside a call; the agent exits without waiting for it")
    ).toBe(true)
  }, 120_000)

  it("does not hold `render`'s exit either, NVML hung from its first call", async () => {
    // render's release and exit follow each other in one turn: the way out must be bound before the worker starts
    const block = path.join(nvml.dir, "block")
    fs.writeFileSync(block, "")
    const config = path.join(nvml.dir, "render.toml")
    fs.writeFileSync(config, '[models.m]\nhf_repo = "org/m"\n')
    // runCli's own bound is 30 s; the NVML open waits out its 10 s deadline, then render goes on without GPUs
    const run = await runCli(["render", "--config", config], {
      CGN_NVML_LIBRARY: nvml.library,
      FAKE_NVML_BLOCK_FILE: block
    })
    expect(run.code).toBe(0)
    expect(run.stdout).toContain("vllm serve")
    expect(fs.existsSync(block)).toBe(true)
  }, 60_000)
})
