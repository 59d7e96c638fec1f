// GPU-aware supervision through the real processes: the built agent (dist/main.js) loads the fake
// libnvidia-ml.so through koffi (CGN_NVML_LIBRARY), whose GPUs a state file scripts while the agent runs
// (FAKE_NVML_STATE), and supervises the simulator. Covers: no spawn while the engine's GPU holds memory,
// unhealthy with pids and bytes once gpu_free_timeout passes, the start once it is freed (with
// CUDA_VISIBLE_DEVICES), a restart that waits the same way, a faulty GPU making the node unhealthy at once,
// a GPU whose memory NVML cannot report (judged by its processes, never taken as 0), and `check` / `render`
// resolving GPUs through NVML.
import * as fs from "node:fs"
import * as path from "node:path"
import { Etcd3 } from "etcd3"
import { afterEach, beforeAll, describe, expect, it, onTestFinished } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { nodeKey } from "../../src/services/registry/HealthReporter.ts"
import { killAllAgents, processAlive, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { runCli } from "../support/cli.ts"
import { engineBinEnv } from "../support/engineBin.ts"
import { startEtcd } from "../support/etcd.ts"
import { fetchText } from "../support/http.ts"
import { useFakeNvml } from "../support/nvml.ts"
import { pollUntil } from "../support/poll.ts"

const GiB = 2 ** 30

const nvml = useFakeNvml("cgn-gpu-")
beforeAll(() => {
  requireDist()
})
afterEach(killAllAgents)

/** A state file for the fake NVML; `write` replaces what the GPUs report from the next sample on. */
const nvmlState = (name: string) => {
  const file = path.join(nvml.dir, name)
  const write = (lines: ReadonlyArray<string>) => fs.writeFileSync(file, `${lines.join("\n")}\n`)
  write([])
  return { file, write }
}

const text = fetchText

interface Status {
  health: {
    state: string
    engine: { detail: string }
    capacity: {
      engineGpus: Array<number>
      gpus: Array<{ index: number; lost: boolean; uuid: string; unreportedFields?: Array<string> }>
    }
  }
  engine: { state: { _tag: string }; pid: number | null; restarts: number }
  gpuGate: { gpus: Array<number>; waiting?: { overdue: boolean; holders: Array<{ pid: number; bytes: number }> } }
}
const status = async (adminUrl: string) => (await (await fetch(`${adminUrl}/status`)).json()) as Status

// Bounds, not waits: each poll returns as soon as its condition holds; a loaded machine only takes longer.
const BOUND = 60_000

const HELD = [`gpu.0.used=${75 * GiB}`, `gpu.0.procs=4242:${75 * GiB}`]
const FREE = [`gpu.0.used=${GiB / 4}`]

describe("GPU-aware supervision (built agent, fake NVML through koffi)", () => {
  it("waits for GPU memory before the first spawn and before a restart; unhealthy with pids and bytes past gpu_free_timeout", async () => {
    const state = nvmlState("held.state")
    state.write(HELD)
    const s = await simAgentConfig({ engine: { gpu_free_timeout: "1s", restart_backoff_initial: "100ms" } })
    const config = { ...s.config, models: { m: { hf_repo: "org/m", gpus: [0] } } }
    const agent = await startAgent({
      config,
      awaitReady: false,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state.file },
      readyTimeoutMs: BOUND
    })
    const spawnLogs = () => agent.logs().filter((l) => String(l.msg).includes(": spawning"))

    // past the timeout: unhealthy, with the holder named, and nothing spawned
    const readyz = await pollUntil(
      "readyz says the GPU memory is held",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("waiting for GPU memory") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain("pid 4242 75.0 GiB on GPU 0")
    const held = await status(agent.adminUrl)
    expect(held.health.state).toBe("unhealthy")
    expect(held.health.capacity.engineGpus).toEqual([0])
    expect(held.gpuGate.waiting).toMatchObject({ overdue: true, holders: [{ pid: 4242, bytes: 75 * GiB }] })
    expect(held.engine.pid).toBeNull()
    expect(spawnLogs()).toEqual([])
    const metrics = await text(`${agent.adminUrl}/metrics`)
    expect(metrics.body).toMatch(/^cgn_agent_engine_gpu_wait 1$/m)

    // freed: the engine starts on GPU 0, numbered as NVML numbers it
    state.write(FREE)
    await pollUntil(
      "ready once the memory is freed",
      async () => (await text(`${agent.adminUrl}/readyz`)).status === 200,
      BOUND
    )
    const [spawn1] = spawnLogs()
    expect(JSON.stringify(spawn1)).toContain('"CUDA_VISIBLE_DEVICES":"0"')
    expect(JSON.stringify(spawn1)).toContain('"CUDA_DEVICE_ORDER":"PCI_BUS_ID"')
    expect((await text(`${agent.adminUrl}/metrics`)).body).toMatch(/^cgn_agent_engine_gpu_wait 0$/m)

    // the engine dies and its memory stays held: the restart waits instead of crash-looping
    const pid = (await status(agent.adminUrl)).engine.pid
    state.write(HELD)
    process.kill(pid as number, "SIGKILL")
    const waiting = await pollUntil(
      "the restart waits for the GPU",
      async () => {
        const st = await status(agent.adminUrl)
        return st.engine.restarts === 1 && st.gpuGate.waiting !== undefined ? st : undefined
      },
      BOUND
    )
    expect(waiting.engine.state._tag).not.toBe("Ready")
    expect(spawnLogs()).toHaveLength(1)
    state.write(FREE)
    await pollUntil(
      "ready again after the restart",
      async () => (await status(agent.adminUrl)).engine.state._tag === "Ready",
      BOUND
    )
    expect(spawnLogs()).toHaveLength(2)
    const messages = agent.logs().map((l) => String(l.msg))
    const waitedAt = messages.lastIndexOf("waiting for the engine's GPUs before starting it")
    expect(waitedAt).toBeGreaterThan(-1)
    expect(waitedAt).toBeLessThan(messages.findLastIndex((m) => m.includes("engine run 1: spawning")))
    expect(processAlive(pid as number)).toBe(false)
    expect((await agent.stop()).code).toBe(0)
  }, 240_000)

  it("an uncorrected ECC error or a lost GPU on the engine's GPU makes the node unhealthy at once, with the reason (etcd too)", async () => {
    const state = nvmlState("faults.state")
    // the fake's GPU 1 holds 4 GiB by default: free it, so only the faults below keep the engine from it
    const free1 = `gpu.1.used=${GiB / 4}`
    state.write([free1])
    // a heartbeat far longer than the test: only the prompt write of a fact can bring the record up to date
    const etcd = await startEtcd()
    const kv = new Etcd3({ hosts: etcd.endpoint })
    onTestFinished(async () => {
      kv.close()
      await etcd.dispose()
    })
    const record = async () => {
      const text = await kv.get(nodeKey("/gpu", "e2e", "e2e-1")).string()
      return text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text))
    }
    const s = await simAgentConfig({
      etcd: [etcd.endpoint],
      etcdPrefix: "/gpu",
      agent: { heartbeat: "30s" },
      engine: { gpu_free_timeout: "1m" }
    })
    const agent = await startAgent({
      config: { ...s.config, models: { m: { hf_repo: "org/m", gpus: [1] } } },
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state.file },
      readyTimeoutMs: BOUND
    })
    // a fault on a GPU the engine does not use changes nothing
    state.write([free1, "gpu.0.ecc=5"])
    await pollUntil(
      "GPU 0's errors sampled",
      async () =>
        /^cgn_agent_gpu_ecc_uncorrected_errors\{gpu="0",[^}]*\} 5$/m.test(
          (await text(`${agent.adminUrl}/metrics`)).body
        ),
      BOUND
    )
    expect((await text(`${agent.adminUrl}/readyz`)).status).toBe(200)
    state.write([free1, "gpu.0.ecc=5", "gpu.1.ecc=2"])
    const ecc = await pollUntil(
      "readyz says ECC",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("ECC") ? r : undefined
      },
      BOUND
    )
    expect(ecc.body).toContain("GPU 1 has 2 uncorrected ECC errors")
    expect((await status(agent.adminUrl)).health.state).toBe("unhealthy")
    const inEtcd = await pollUntil(
      "etcd says unhealthy",
      async () => ((await record())?.state === "unhealthy" ? await record() : undefined),
      10_000
    )
    expect(inEtcd?.engine?.detail).toContain("uncorrected ECC errors")

    state.write([free1, "gpu.1.lost=1"])
    const lost = await pollUntil(
      "readyz says lost",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.body.includes("lost") ? r : undefined
      },
      BOUND
    )
    expect(lost.status).toBe(503)
    // named by the UUID it had before it fell off the bus (a lost GPU answers no query): the board to replace
    const lostUuid = "GPU-55555555-6666-7777-8888-999999999999"
    expect((await text(`${agent.adminUrl}/metrics`)).body).toMatch(
      new RegExp(`^cgn_agent_gpu_lost\\{gpu="1",uuid="${lostUuid}"\\} 1$`, "m")
    )
    expect((await status(agent.adminUrl)).health.capacity.gpus[1]).toMatchObject({
      index: 1,
      lost: true,
      uuid: lostUuid
    })

    // the engine's GPU drops out of NVML's list (its handle query fails): not watched, so not taken as fine
    state.write([free1, "gpu.1.handle_rc=999"])
    const missing = await pollUntil(
      "readyz says the GPU is not in NVML's list",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("not in NVML's list") ? r : undefined
      },
      BOUND
    )
    expect(missing.body).toContain("GPU 1 is not in NVML's list")

    state.write([])
    await pollUntil(
      "ready once the fault clears",
      async () => (await text(`${agent.adminUrl}/readyz`)).status === 200,
      BOUND
    )
    expect((await agent.stop()).code).toBe(0)
  }, 180_000)

  it("a GPU named by UUID that is lost when the agent starts (no UUID to match): held, the agent up, started once it is back", async () => {
    const state = nvmlState("lost-uuid.state")
    const free1 = `gpu.1.used=${GiB / 4}`
    state.write([free1, "gpu.1.lost=1"])
    const s = await simAgentConfig({ engine: { gpu_free_timeout: "1m" } })
    const uuid = "GPU-55555555-6666-7777-8888-999999999999"
    const agent = await startAgent({
      config: { ...s.config, models: { m: { hf_repo: "org/m", gpus: [uuid] } } },
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state.file },
      awaitReady: false
    })
    // it exited 2 before ("not on this host"), as for a UUID the host does not have
    const held = await pollUntil(
      "readyz says the UUID is not listed",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`).catch(() => undefined)
        return r?.status === 503 && r.body.includes("is not among the GPUs NVML lists") ? r : undefined
      },
      BOUND
    )
    expect(held.body).toContain(`GPU "${uuid}" is not among the GPUs NVML lists (NVML cannot read GPU 1's UUID: lost?)`)
    expect((await status(agent.adminUrl)).engine.pid).toBeNull()
    // back on the bus: its UUID matches, the engine starts (on it: CUDA_VISIBLE_DEVICES names the UUID)
    state.write([free1])
    await pollUntil(
      "ready once the GPU is back",
      async () => (await text(`${agent.adminUrl}/readyz`)).status === 200,
      BOUND
    )
    expect((await agent.stop()).code).toBe(0)
  }, 180_000)

  it("a GPU whose memory NVML cannot report (unified memory, GB10) is judged by its processes, not taken as free", async () => {
    const state = nvmlState("unified.state")
    // nvmlDeviceGetMemoryInfo NOT_SUPPORTED, as on GB10; its process list works and shows a tenant
    state.write(["gpu.0.memory_rc=3", `gpu.0.procs=4242:${40 * GiB}`])
    const s = await simAgentConfig({ engine: { gpu_free_timeout: "1s" } })
    const agent = await startAgent({
      config: { ...s.config, models: { m: { hf_repo: "org/m", gpus: [0] } } },
      awaitReady: false,
      env: { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: state.file },
      readyTimeoutMs: BOUND
    })
    const readyz = await pollUntil(
      "readyz says the processes hold memory",
      async () => {
        const r = await text(`${agent.adminUrl}/readyz`)
        return r.status === 503 && r.body.includes("waiting for GPU memory") ? r : undefined
      },
      BOUND
    )
    expect(readyz.body).toContain("GPU 0's processes hold 40.0 GiB (NVML reports no memory use for it")
    const held = await status(agent.adminUrl)
    expect(held.engine.pid).toBeNull()
    // NodeHealth says the memory is unknown rather than 0 bytes in use
    expect(held.health.capacity.gpus[0]?.unreportedFields).toEqual([
      "memory_total_bytes",
      "memory_used_bytes",
      "memory_free_bytes"
    ])
    expect(held.health.capacity.gpus[1]).not.toHaveProperty("unreportedFields")
    const metrics = (await text(`${agent.adminUrl}/metrics`)).body
    expect(metrics).not.toMatch(/^cgn_agent_gpu_memory_(used|total)_bytes\{gpu="0",/m)
    expect(metrics).toMatch(/^cgn_agent_gpu_memory_used_bytes\{gpu="1",[^}]*\} 4294967297$/m)

    // the tenant is gone: nothing listed holds memory, so the engine starts
    state.write(["gpu.0.memory_rc=3"])
    await pollUntil(
      "ready once the processes are gone",
      async () => (await text(`${agent.adminUrl}/readyz`)).status === 200,
      BOUND
    )
    expect((await agent.stop()).code).toBe(0)
  }, 180_000)

  it("check and render resolve the GPUs through NVML: automatic assignment shown, a tp the host cannot hold refused", async () => {
    // a state_dir any user can use, and vllm on PATH: check refuses what run could not start (hostChecks.ts)
    const file = (name: string, tp: number) => {
      const f = path.join(nvml.dir, name)
      fs.writeFileSync(f, `[agent]\nstate_dir = "${nvml.dir}/state"\n[models."m"]\nhf_repo = "org/m"\ntp = ${tp}\n`)
      return f
    }
    const bin = engineBinEnv(nvml.dir)
    const env = { CGN_NVML_LIBRARY: nvml.library, FAKE_NVML_STATE: path.join(nvml.dir, "none.state"), ...bin }
    const render = await runCli(["render", "--config", file("tp2.toml", 2)], env)
    expect(render.code).toBe(0)
    expect(render.stdout).toContain("CUDA_VISIBLE_DEVICES=0,1")
    const check = await runCli(["check", "--config", file("tp4.toml", 4)], env)
    expect(check.code).toBe(2)
    expect(check.stderr).toContain(
      'models."m".gpus: the engine needs 4 GPUs (tp x dp) but this host has 2 usable of 2 (2 healthy)'
    )
    // without NVML the same file passes: nothing says the host is too small
    const noNvml = await runCli(["check", "--config", file("tp4b.toml", 4)], { CGN_NVML_LIBRARY: "none", ...bin })
    expect(noNvml.code, noNvml.stderr).toBe(0)
  }, 180_000)
})
