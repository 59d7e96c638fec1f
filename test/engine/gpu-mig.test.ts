// An engine on a MIG device through the real processes: the built agent (dist/main.js) on the fake libnvidia-ml.so
// (CGN_NVML_LIBRARY, FAKE_NVML_STATE scripting GPU 1 in MIG mode) supervises the simulator. Covers: models.gpus =
// ["MIG-..."] starts the engine with CUDA_VISIBLE_DEVICES set to the MIG device while another tenant's MIG device on
// the same board holds most of its memory (capacity.engineMigDevice names it); the MIG device gone (instance destroyed)
// holds a restart, naming it; with the GPU's own process list refused (no mig/monitor capability) a restart waits on
// the process the MIG device's own list shows; a MIG list NVML cannot read at start holds the start instead of exiting
// 2; `check` shows the MIG device (also by its name before R470, handed to CUDA as NVML names it), refuses two, and
// refuses a GPU in MIG mode named whole (exit 2, the key and the reason).
import * as fs from "node:fs"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { runCli } from "../support/cli.ts"
import { engineBinEnv } from "../support/engineBin.ts"
import { fetchText } from "../support/http.ts"
import { useFakeNvml } from "../support/nvml.ts"
import { pollUntil } from "../support/poll.ts"

const GiB = 2 ** 30
const BOUND = 60_000
const MINE = "MIG-0a0a0a0a-1111-2222-3333-000000000001"
const THEIRS = "MIG-0a0a0a0a-1111-2222-3333-000000000002"
// the fake's GPU 1 (test/fixtures/fake_nvml.c), and MINE by the name drivers before R470 gave it
const GPU1 = "GPU-55555555-6666-7777-8888-999999999999"
const MINE_LEGACY = `MIG-${GPU1}/1/0`

const nvml = useFakeNvml("cgn-gpu-mig-")
beforeAll(() => {
  requireDist()
})
afterEach(killAllAgents)

/** GPU 1 in MIG mode: my MIG device nearly empty, another tenant's holding 60 GiB (the board: 60.25 GiB in use). */
const board = (withMine: boolean) => [
  "gpu.1.mig=1",
  `gpu.1.used=${60.25 * GiB}`,
  `gpu.1.mig_devices=${[
    ...(withMine ? [`0:${MINE}:1:0:${GiB / 4}:${40 * GiB}`] : []),
    `1:${THEIRS}:2:0:${60 * GiB}:${40 * GiB}`
  ].join(",")}`,
  `gpu.1.procs=4242:${60 * GiB}:2:0`
]

interface Status {
  health: {
    capacity: {
      engineGpus: Array<number>
      engineMigDevice?: string
      gpus: Array<{ index: number; migEnabled?: boolean }>
    }
  }
  engine: { state: { _tag: string }; pid: number | null; restarts: number }
  gpuGate: {
    gpus: Array<number>
    mig?: string
    fault?: string
    waiting?: { reason: string; holders: Array<{ pid: number; mig?: string }> }
  }
}
const status = async (adminUrl: string) => (await (await fetch(`${adminUrl}/status`)).json()) as Status

describe("an engine on a MIG device (built agent, fake NVML through koffi)", () => {
  it("starts on the MIG device while another tenant's fills the board; waits, naming it, once it is gone", async () => {
    const state = path.join(nvml.dir, "mig.state")
    const write = (lines: ReadonlyArray<string>) => fs.writeFileSync(state, `${lines.join("\n")}\n`)
    write(board(true))
    const s = await simAgentConfig({ engine: { restart_backoff_initial: "100ms" } })
    const config = { ...s.config, models: { m: { hf_repo: "org/m", gpus: [MINE] } } }
    const agent = await startAgent({
      config,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state },
      readyTimeoutMs: BOUND
    })
    const spawnLogs = () => agent.logs().filter((l) => String(l.msg).includes(": spawning"))
    const [spawn] = spawnLogs()
    expect(JSON.stringify(spawn)).toContain(`"CUDA_VISIBLE_DEVICES":"${MINE}"`)
    expect(JSON.stringify(spawn)).toContain('"CUDA_DEVICE_ORDER":"PCI_BUS_ID"')
    const ready = await status(agent.adminUrl)
    expect(ready.gpuGate).toMatchObject({ gpus: [1], mig: MINE })
    expect(ready.health.capacity.engineGpus).toEqual([1])
    expect(ready.health.capacity.engineMigDevice).toBe(MINE)
    expect(ready.health.capacity.gpus[1]?.migEnabled).toBe(true)

    // the instance destroyed under the engine, which then dies: the restart waits, and the node says why
    write(board(false))
    process.kill(ready.engine.pid as number, "SIGKILL")
    const readyz = await pollUntil(
      "readyz names the missing MIG device",
      async () => {
        const r = await fetchText(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes(MINE) ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain(`MIG device ${MINE} is not in NVML's list`)
    expect(spawnLogs()).toHaveLength(1)
    // recreated: the engine starts again
    write(board(true))
    await pollUntil(
      "ready again once the MIG device is back",
      async () => (await status(agent.adminUrl)).engine.state._tag === "Ready",
      BOUND
    )
    expect(spawnLogs()).toHaveLength(2)

    // the GPU's own process list refused (NO_PERMISSION, as without the mig/monitor capability) while a process holds
    // the MIG device: the restart waits on it, found by the MIG device's own list
    write([
      ...board(true).map((l) => (l.startsWith("gpu.1.mig_devices=") ? l.replace(`${GiB / 4}`, `${20 * GiB}`) : l)),
      `gpu.1.procs=4242:${60 * GiB}:2:0,4343:${20 * GiB}:1:0`,
      "gpu.1.procs_rc=4"
    ])
    process.kill((await status(agent.adminUrl)).engine.pid as number, "SIGKILL")
    const waiting = await pollUntil(
      "the restart waits on the MIG device's own process",
      async () => {
        const st = await status(agent.adminUrl)
        return st.engine.restarts === 2 && st.gpuGate.waiting !== undefined ? st : undefined
      },
      BOUND
    )
    expect(waiting.gpuGate.waiting?.holders).toMatchObject([{ pid: 4343, mig: MINE }])
    expect(waiting.gpuGate.waiting?.reason).toContain(`pid 4343 20.0 GiB on ${MINE}`)
    expect(spawnLogs()).toHaveLength(2)
    write([...board(true), "gpu.1.procs_rc=4"])
    await pollUntil(
      "ready once the MIG device is free",
      async () => (await status(agent.adminUrl)).engine.state._tag === "Ready",
      BOUND
    )
    expect((await agent.stop()).code).toBe(0)
  }, 240_000)

  it("a MIG list NVML cannot read at start holds the start, saying so, and starts once it reads", async () => {
    const state = path.join(nvml.dir, "unread.state")
    const write = (lines: ReadonlyArray<string>) => fs.writeFileSync(state, `${lines.join("\n")}\n`)
    // slot 0 (MINE) answers NVML_ERROR_UNKNOWN to nvmlDeviceGetMigDeviceHandleByIndex
    write([...board(true), "gpu.1.mig_slot_rc=0:999"])
    const s = await simAgentConfig({ engine: { restart_backoff_initial: "100ms" } })
    const config = { ...s.config, models: { m: { hf_repo: "org/m", gpus: [MINE] } } }
    const agent = await startAgent({
      config,
      awaitReady: false,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state },
      readyTimeoutMs: BOUND
    })
    const readyz = await pollUntil(
      "readyz says NVML could not read the MIG devices",
      async () => {
        const r = await fetchText(`${agent.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("MIG devices") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain(`NVML could not read GPU 1's MIG devices (a MIG query failed), so MIG device ${MINE}`)
    expect(agent.logs().filter((l) => String(l.msg).includes(": spawning"))).toEqual([])
    write(board(true))
    await pollUntil(
      "ready once the list reads",
      async () => (await status(agent.adminUrl)).engine.state._tag === "Ready",
      BOUND
    )
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)

  it("check shows the MIG device and the GPU it is on; two MIG devices exit 2 with the key and the reason", async () => {
    const state = path.join(nvml.dir, "check.state")
    fs.writeFileSync(state, `${board(true).join("\n")}\n`)
    // vllm on PATH: check refuses an engine it cannot find (src/programs/hostChecks.ts)
    const env = { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state, ...engineBinEnv(nvml.dir) }
    const file = (name: string, gpus: ReadonlyArray<string>, tp: number) => {
      const f = path.join(nvml.dir, name)
      // a state_dir check can use as any user (the default, /var/lib/cgn-agent, needs root)
      fs.writeFileSync(
        f,
        `[agent]\nstate_dir = "${nvml.dir}/state"\n[models."m"]\nhf_repo = "org/m"\ntp = ${tp}\ngpus = ${JSON.stringify(gpus)}\n`
      )
      return f
    }
    const one = await runCli(["check", "--config", file("one.toml", [MINE], 1)], env)
    expect(one.code).toBe(0)
    expect(one.stdout).toContain(`gpus:`)
    expect(one.stdout).toContain(`${MINE} (a MIG device on GPU 1; CUDA_VISIBLE_DEVICES=${MINE})`)
    const two = await runCli(["check", "--config", file("two.toml", [MINE, THEIRS], 2)], env)
    expect(two.code).toBe(2)
    expect(two.stderr).toContain('models."m".gpus: lists 2 MIG devices, but CUDA enumerates only one MIG device')
    const legacy = await runCli(["check", "--config", file("legacy.toml", [MINE_LEGACY], 1)], env)
    expect(legacy.code).toBe(0)
    expect(legacy.stdout).toContain(`${MINE_LEGACY} (a MIG device on GPU 1; CUDA_VISIBLE_DEVICES=${MINE})`)
    const whole = await runCli(["check", "--config", file("whole.toml", [GPU1], 1)], env)
    expect(whole.code).toBe(2)
    expect(whole.stderr).toContain(`models."m".gpus: GPU "${GPU1}" is in MIG mode`)
    expect(whole.stderr).toContain(`NVML lists ${MINE} on GPU 1, ${THEIRS} on GPU 1`)
    const absent = await runCli(["check", "--config", file("absent.toml", ["MIG-absent"], 1)], env)
    expect(absent.code).toBe(2)
    expect(absent.stderr).toContain('models."m".gpus: MIG device MIG-absent is not on this host')
  }, 120_000)
})
