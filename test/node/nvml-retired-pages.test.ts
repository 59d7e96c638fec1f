// A pending page retirement end to end (dynamic page retirement: V100, T4, the boards before row remapping): the
// built agent (dist/main.js) loads the fake libnvidia-ml.so through koffi (CGN_NVML_LIBRARY), whose
// nvmlDeviceGetRetiredPagesPendingStatus answers per FAKE_NVML_STATE. A page retirement pending on the engine's GPU
// makes the node unhealthy at once, with the reason in /readyz and /status, the flag in NodeHealth's GPU record and
// the gauge on /metrics (no series for a GPU that answers NOT_SUPPORTED, as one that remaps rows instead), which passes
// promtool check metrics; once NVML no longer reports it (the GPU reset), the node is ready again.
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
const G0 = 'gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"'
const G1 = 'gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"'
const REASON = "GPU 1 has retired memory pages pending: it needs a GPU reset or a reboot"

const nvml = useFakeNvml("cgn-pages-")
beforeAll(() => {
  requireDist()
})
afterEach(killAllAgents)

const text = fetchText

interface Status {
  health: {
    state: string
    engine: { detail: string }
    capacity: { gpus: Array<{ index: number; retiredPagesPending?: boolean; unreportedFields?: Array<string> }> }
  }
}

describe("a page retirement pending on the engine's GPU (built agent, fake NVML through koffi)", () => {
  it("makes the node unhealthy at once, with the reason, until NVML no longer reports it", async () => {
    const state = path.join(nvml.dir, "pages.state")
    // the fake's GPU 1 holds 4 GiB by default: free it, so only the page retirement keeps the engine from it; GPU 0
    // is a board that remaps rows instead (NOT_SUPPORTED): unreported, no series, no fault
    const base = `gpu.1.used=${GiB / 4}\ngpu.0.pages_rc=3\n`
    fs.writeFileSync(state, base)
    const s = await simAgentConfig({ engine: { gpu_free_timeout: "1m" } })
    const agent = await startAgent({
      config: { ...s.config, models: { m: { hf_repo: "org/m", gpus: [1] } } },
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state },
      readyTimeoutMs: BOUND
    })
    expect((await text(`${agent.adminUrl}/readyz`)).status).toBe(200)

    fs.writeFileSync(state, `${base}gpu.1.pages_pending=1\n`)
    const readyz = await pollUntil(
      "readyz says the pending page retirement",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("retired memory pages") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain(REASON)
    const st = (await (await fetch(`${agent.adminUrl}/status`)).json()) as Status
    expect(st.health.state).toBe("unhealthy")
    expect(st.health.engine.detail).toContain(REASON)
    expect(st.health.capacity.gpus[1]?.retiredPagesPending).toBe(true)
    expect(st.health.capacity.gpus[0]?.unreportedFields).toEqual(["retired_pages_pending"])

    const page = (await text(`${agent.adminUrl}/metrics`)).body
    expect(page.split("\n").filter((l) => l.startsWith("cgn_agent_gpu_retired_pages_pending"))).toEqual([
      `cgn_agent_gpu_retired_pages_pending{${G1}} 1`
    ])
    expect(page).not.toContain(`cgn_agent_gpu_retired_pages_pending{${G0}}`)
    const lint = promtool(["check", "metrics"], page)
    expect(lint.output).toBe("")
    expect(lint.status).toBe(0)

    // the GPU reset: the pages are retired, NVML reports nothing pending, and the node is ready again
    fs.writeFileSync(state, base)
    await pollUntil("readyz ready again", async () => (await text(`${agent.adminUrl}/readyz`)).status === 200, BOUND)
    expect((await text(`${agent.adminUrl}/metrics`)).body).toContain(`cgn_agent_gpu_retired_pages_pending{${G1}} 0`)
    expect((await agent.stop()).code).toBe(0)
  }, 180_000)
})
