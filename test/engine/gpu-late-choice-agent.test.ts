// The engine's GPUs chosen once NVML answers, end to end: the built agent (dist/main.js) starts with models.x.gpus
// unset while every call of the fake libnvidia-ml.so hangs (FAKE_NVML_BLOCK_FILE: a GPU off the bus hangs NVML), with
// Xid 79 of GPU 0 in this boot's record (agent.state_dir/gpu-xids.json). Held while NVML is silent; once it answers,
// the automatic choice takes the healthy GPU 1 (it kept the engine held for good on GPU 0's fault before, and a plain
// restart was needed), the engine is spawned with CUDA_VISIBLE_DEVICES=1 and the node is ready.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { fetchText } from "../support/http.ts"
import { useFakeNvml } from "../support/nvml.ts"
import { pollUntil } from "../support/poll.ts"

// Bounds, not waits: each poll returns as soon as its condition holds; a loaded machine only takes longer.
const BOUND = 60_000
const GPU0 = "GPU-00000000-1111-2222-3333-444444444444"

const nvml = useFakeNvml("cgn-late-choice-")
beforeAll(() => {
  requireDist()
})
afterEach(async () => {
  // unblock first: a worker left inside the call would hold its process
  fs.rmSync(path.join(nvml.dir, "block"), { force: true })
  await killAllAgents()
})

interface Status {
  health: { capacity: { engineGpus?: Array<number>; gpus?: Array<unknown> } }
  gpuGate: { gpus: Array<number> }
}

describe("GPUs chosen once NVML answers (built agent, fake NVML through koffi)", () => {
  it("NVML hung at start, Xid 79 remembered on GPU 0, gpus unset: once NVML answers the engine starts on GPU 1", async () => {
    const stateDir = path.join(nvml.dir, "state")
    fs.mkdirSync(stateDir, { mode: 0o700 })
    const bootId = fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    const record = { bootId, gpus: [{ uuid: GPU0, xids: [{ xid: 79, events: 1 }] }] }
    fs.writeFileSync(path.join(stateDir, "gpu-xids.json"), JSON.stringify(record), { mode: 0o600 })
    // both GPUs free (the fake's hold 20 GiB and 4 GiB otherwise)
    const state = path.join(nvml.dir, "nvml.state")
    fs.writeFileSync(state, "gpu.0.used=268435456\ngpu.1.used=268435456\n")
    const block = path.join(nvml.dir, "block")
    fs.writeFileSync(block, "")
    const { config } = await simAgentConfig({ agent: { state_dir: stateDir } })
    const agent = await startAgent({
      config,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state, FAKE_NVML_BLOCK_FILE: block },
      awaitReady: false
    })

    // NVML silent: held on the remembered fault, as on any GPU it may be the engine's
    const held = await pollUntil(
      "readyz says the remembered Xid 79",
      async () => {
        const r = await fetchText(`${agent.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("Xid 79") ? r : undefined
      },
      BOUND
    )
    expect(held.body).toContain("the configuration names no UUIDs")
    expect(agent.logs().some((l) => String(l.msg).includes(": spawning"))).toBe(false)

    // NVML answers: GPU 0 has the Xid, GPU 1 is sound
    fs.rmSync(block)
    await pollUntil("ready", async () => (await fetchText(`${agent.adminUrl}/readyz`)).status === 200, BOUND)
    const spawning = agent.stderrLines.filter((l) => l.includes(": spawning"))
    expect(spawning).toHaveLength(1)
    expect(spawning[0]).toContain('"CUDA_VISIBLE_DEVICES":"1"')
    expect(spawning[0]).toContain('"CUDA_DEVICE_ORDER":"PCI_BUS_ID"')
    const chosen = agent.logs().filter((l) => String(l.msg).startsWith("the engine's GPUs chosen"))
    expect(chosen).toHaveLength(1)
    expect(chosen[0]?.gpus).toBe("1")
    const st = (await (await fetch(`${agent.adminUrl}/status`)).json()) as Status
    expect(st.health.capacity.engineGpus).toEqual([1])
    expect(st.gpuGate.gpus).toEqual([1])
    expect(st.health.capacity.gpus).toHaveLength(2)
    expect((await agent.stop()).code).toBe(0)
  }, 180_000)
})
