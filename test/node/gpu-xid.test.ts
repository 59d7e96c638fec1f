// A critical Xid end to end: the built agent (dist/main.js) loads the fake libnvidia-ml.so through koffi
// (CGN_NVML_LIBRARY), which delivers the lines of FAKE_NVML_XID_FILE as Xid events. An application Xid (13) on the
// engine's GPU changes nothing; Xid 79 makes the node unhealthy at once, with the reason in /readyz and /status, the
// Xid in NodeHealth's GPU record, and the counter on /metrics, which passes promtool check metrics. The agent started
// again (NVML delivers no past event) still holds the GPU faulty, from state_dir, until POST /gpus/clear-xids; so
// does one started while NVML does not answer, and one whose automatic choice of GPUs finds none healthy.
import * as fs from "node:fs"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { fetchText } from "../support/http.ts"
import { useFakeNvml } from "../support/nvml.ts"
import { pollUntil } from "../support/poll.ts"
import { promtool } from "../support/promtool.ts"

const GiB = 2 ** 30
// Bounds, not waits: each poll returns as soon as its condition holds; a loaded machine only takes longer.
const BOUND = 60_000
const G1 = 'gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"'

const nvml = useFakeNvml("cgn-xid-")
beforeAll(() => {
  requireDist()
})
afterEach(killAllAgents)

const text = fetchText

interface Status {
  health: {
    state: string
    engine: { detail: string }
    capacity: { gpus: Array<{ index: number; criticalXids?: Array<{ xid: number; events: number }> }> }
  }
}

describe("a critical Xid on the engine's GPU (built agent, fake NVML through koffi)", () => {
  it("an application Xid changes nothing; Xid 79 makes the node unhealthy at once, with the reason", async () => {
    const state = path.join(nvml.dir, "xid.state")
    const xids = path.join(nvml.dir, "xid.events")
    // the fake's GPU 1 holds 4 GiB by default: free it, so only the Xid keeps the engine from it
    fs.writeFileSync(state, `gpu.1.used=${GiB / 4}\n`)
    fs.writeFileSync(xids, "")
    const s = await simAgentConfig({
      engine: { gpu_free_timeout: "1m" },
      agent: { state_dir: path.join(nvml.dir, "state") }
    })
    const config = { ...s.config, models: { m: { hf_repo: "org/m", gpus: [1] } } }
    const env = { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state, FAKE_NVML_XID_FILE: xids }
    const agent = await startAgent({ config, env, readyTimeoutMs: BOUND })
    // an engine's own fault (a kernel's illegal access): counted, no fault
    fs.appendFileSync(xids, "1 13\n")
    await pollUntil(
      "Xid 13 counted",
      async () =>
        (await text(`${agent.adminUrl}/metrics`)).body.includes(
          `cgn_agent_gpu_xid_errors_total{${G1},xid="13",fault="false"} 1`
        ),
      BOUND
    )
    expect((await text(`${agent.adminUrl}/readyz`)).status).toBe(200)

    fs.appendFileSync(xids, "1 79\n")
    const readyz = await pollUntil(
      "readyz says Xid 79",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("Xid 79") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain("GPU 1 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot")
    const st = (await (await fetch(`${agent.adminUrl}/status`)).json()) as Status
    expect(st.health.state).toBe("unhealthy")
    expect(st.health.engine.detail).toContain("GPU 1 reported Xid 79 (fallen off the bus)")
    expect(st.health.capacity.gpus[1]?.criticalXids).toEqual([
      { xid: 13, events: 1 },
      { xid: 79, events: 1 }
    ])

    const page = (await text(`${agent.adminUrl}/metrics`)).body
    expect(page).toContain(`cgn_agent_gpu_xid_errors_total{${G1},xid="79",fault="true"} 1`)
    expect(page).toContain(`cgn_agent_gpu_row_remap_pending{${G1}} 0`)
    expect(page).toContain(`cgn_agent_gpu_row_remap_failure{${G1}} 0`)
    const lint = promtool(["check", "metrics"], page)
    expect(lint.output).toBe("")
    expect(lint.status).toBe(0)
    // a fault until the GPU is reset: later samples do not clear it
    expect((await text(`${agent.adminUrl}/readyz`)).status).toBe(503)
    expect((await agent.stop()).code).toBe(0)

    // the agent again while NVML does not answer (a GPU off the bus hangs it; here its init fails): the Xid kept in
    // state_dir holds the engine and stays on /metrics (no index: NVML has not listed the GPU in this agent's life)
    fs.writeFileSync(xids, "")
    const blind = await startAgent({ config, env: { ...env, FAKE_NVML_INIT_RC: "999" }, awaitReady: false })
    const blindReadyz = await pollUntil(
      "readyz says Xid 79 with NVML down",
      async () => {
        const r = await text(`${blind.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("Xid 79") ? r : undefined
      },
      BOUND
    )
    expect(blindReadyz.body).toContain("earlier in this boot and NVML has not answered since the agent started")
    const blindPage = (await text(`${blind.adminUrl}/metrics`)).body
    expect(blindPage).toContain("cgn_agent_nvml_up 0")
    expect(blindPage).toContain(
      'cgn_agent_gpu_xid_errors_total{gpu="",uuid="GPU-55555555-6666-7777-8888-999999999999",xid="79",fault="true"} 1'
    )
    // no engine run was spawned onto the GPU
    const blindStatus = (await (await fetch(`${blind.adminUrl}/status`)).json()) as {
      engine: { state: { _tag: string }; pid: number | null }
    }
    expect(blindStatus.engine.pid).toBeNull()
    expect(blindStatus.engine.state._tag).not.toBe("Ready")
    expect((await blind.stop()).code).toBe(0)

    // the agent again (a rollout, a crash): its NVML session delivers no past event, the GPU still needs its reset
    const again = await startAgent({ config, env, awaitReady: false })
    await pollUntil(
      "readyz says Xid 79 after the restart",
      async () => {
        const r = await text(`${again.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("Xid 79") ? r : undefined
      },
      BOUND
    )
    expect((await text(`${again.adminUrl}/metrics`)).body).toContain(
      `cgn_agent_gpu_xid_errors_total{${G1},xid="79",fault="true"} 1`
    )
    // the operator reset the GPU: the engine starts on it again
    const cleared = await fetch(`${again.adminUrl}/gpus/clear-xids?gpu=1`, { method: "POST" })
    expect(cleared.status).toBe(200)
    expect(await cleared.json()).toEqual({
      cleared: [
        {
          gpu: 1,
          uuid: "GPU-55555555-6666-7777-8888-999999999999",
          xids: [
            { xid: 13, events: 1, name: "Xid 13 (graphics engine exception)" },
            { xid: 79, events: 1, name: "Xid 79 (fallen off the bus)" }
          ]
        }
      ]
    })
    await pollUntil("ready once cleared", async () => (await text(`${again.adminUrl}/readyz`)).status === 200, BOUND)
    expect((await again.stop()).code).toBe(0)
  }, 240_000)

  it("with models.x.gpus unset, an agent restarted after a fault on every GPU stays up: unhealthy, the engine held, until cleared", async () => {
    const state = path.join(nvml.dir, "auto.state")
    const xids = path.join(nvml.dir, "auto.events")
    fs.writeFileSync(state, `gpu.0.used=${GiB / 4}\ngpu.1.used=${GiB / 4}\n`)
    fs.writeFileSync(xids, "")
    const s = await simAgentConfig({ agent: { state_dir: path.join(nvml.dir, "auto-state") } })
    const env = { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state, FAKE_NVML_XID_FILE: xids }
    const first = await startAgent({ config: s.config, env, readyTimeoutMs: BOUND })
    fs.appendFileSync(xids, "0 79\n1 48\n")
    await pollUntil(
      "both Xids kept",
      async () => {
        const page = (await text(`${first.adminUrl}/metrics`)).body
        return page.includes('xid="79",fault="true"} 1') && page.includes('xid="48",fault="true"} 1')
      },
      BOUND
    )
    expect((await first.stop()).code).toBe(0)

    // started again (a rollout): the automatic choice has no healthy GPU; the GPU it takes holds the engine, and the
    // agent serves its admin port (it exited 2, "invalid config", before: a crash loop with nothing to clear it by)
    fs.writeFileSync(xids, "")
    const again = await startAgent({ config: s.config, env, awaitReady: false })
    const readyz = await pollUntil(
      "readyz says the GPU's Xid",
      async () => {
        const r = await text(`${again.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("GPU 0 reported Xid 79") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain("it needs a GPU reset or a reboot")
    const held = (await (await fetch(`${again.adminUrl}/status`)).json()) as { engine: { pid: number | null } }
    expect(held.engine.pid).toBeNull()
    expect((await fetch(`${again.adminUrl}/gpus/clear-xids`, { method: "POST" })).status).toBe(200)
    await pollUntil("ready once cleared", async () => (await text(`${again.adminUrl}/readyz`)).status === 200, BOUND)
    expect((await again.stop()).code).toBe(0)
  }, 240_000)
})
