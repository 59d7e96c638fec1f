// `cgn-agent check`'s summary: it shows dp next to tp; the GPUs an automatic assignment takes on this host (check
// resolves them through NVML, as run does), and none for an engine the agent hands no GPUs (mlx, openai_compat);
// and whether the KV events the engine publishes reach cgn-kvcached (`run` forwards them only to a `[kv].uds`); the
// memory limit of the agent's cgroup, which the engine shares, and a warning when KVBM's CPU tier alone reaches it.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Result } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { summarize } from "../../src/programs/check.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { runCli } from "../support/cli.ts"
import { canCreateMemoryCgroup, createMemoryCgroup } from "../support/memoryCgroup.ts"
import { buildFakeNvml } from "../support/nvml.ts"

const load = (text: string): AgentConfig => {
  const r = decodeConfig(text, "summary.toml", {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

/** The value of one `key: value` line of the summary. */
const line = (summary: string, key: string): string | undefined =>
  summary
    .split("\n")
    .map((l) => new RegExp(`^  ${key}: +(.*)$`).exec(l)?.[1])
    .find((v) => v !== undefined)

describe("check's summary", () => {
  it("shows dp: tp x dp GPUs are what the engine takes", () => {
    const s = summarize(load('[models.m]\nhf_repo = "a/b"\ntp = 2\ndp = 3\n'))
    expect([line(s, "tp"), line(s, "dp")]).toEqual(["2", "3"])
  })

  it("KV events on without [kv].uds: said to be forwarded nowhere (run only warns)", () => {
    const s = summarize(load('[kv]\nevents = true\n[models.m]\nhf_repo = "a/b"\n'))
    expect(line(s, "kv events")).toBe("on, tcp://127.0.0.1:5557, not forwarded ([kv].uds is not set)")
  })

  it("KV events on with [kv].uds: the socket they are forwarded to", () => {
    const s = summarize(load('[kv]\nevents = true\nuds = "/run/cgn/kvcached.sock"\n[models.m]\nhf_repo = "a/b"\n'))
    expect(line(s, "kv events")).toBe("on, tcp://127.0.0.1:5557, forwarded to /run/cgn/kvcached.sock")
  })

  it("the shutdown's worst case, in terminationGracePeriodSeconds' unit (the example DaemonSet sets 180 for 155.75 s)", () => {
    const etcd = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n[engine]\nstop_grace = "60s"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(etcd), "shutdown")).toBe(
      "within 2m 35s 750ms, every peer hung (terminationGracePeriodSeconds: at least 156)"
    )
  })

  it("KV events to kvcached add 1 s: the last call's cancel message, which effect's RpcClient waits 1 s for", () => {
    const kv = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n[engine]\nstop_grace = "60s"\n' +
        '[kv]\nevents = true\nuds = "/run/cgn/kvcached.sock"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(kv), "shutdown")).toBe(
      "within 2m 36s 750ms, every peer hung (terminationGracePeriodSeconds: at least 157)"
    )
  })

  it("KV events off", () => {
    expect(line(summarize(load('[models.m]\nhf_repo = "a/b"\n')), "kv events")).toBe("off")
  })

  it("automatic GPUs: the ones NVML gave the plan now, else said to be picked at start", () => {
    const c = load('[models.m]\nhf_repo = "a/b"\ntp = 2\n')
    const plan = { ...engineFor("vllm").render(c), gpus: [0, 1] }
    expect(line(summarize(c, plan), "gpus")).toBe(
      "0, 1 (automatic: the first tp x dp healthy GPUs now; picked again at start)"
    )
    expect(line(summarize(c), "gpus")).toBe("automatic (the first tp x dp healthy GPUs at start)")
  })

  it("an engine the agent hands no GPUs (mlx, openai_compat): none", () => {
    const mlx = load('[engine]\nkind = "mlx"\n[models.m]\nhf_repo = "a/b"\n')
    const remote = load('[engine]\nkind = "openai_compat"\n[models.m]\nhf_repo = "a/b"\n')
    expect([line(summarize(mlx), "gpus"), line(summarize(remote), "gpus")]).toEqual([
      "none handed out (mlx)",
      "none handed out (openai_compat)"
    ])
  })
})

describe("check on a host with NVML (a fake libnvidia-ml.so with two GPUs)", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-nvml-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

  it("names the GPUs an automatic assignment takes, as render's CUDA_VISIBLE_DEVICES does", async () => {
    const env = { CGN_NVML_LIBRARY: buildFakeNvml(dir) }
    const r = await runCli(["check", "--config", "examples/dev.toml"], env)
    expect(r.code, r.stderr).toBe(0)
    expect(line(r.stdout, "gpus")).toBe("0 (automatic: the first tp x dp healthy GPUs now; picked again at start)")
    const rendered = await runCli(["render", "--config", "examples/dev.toml"], env)
    expect(rendered.stdout).toContain("CUDA_VISIBLE_DEVICES=0")
  })

  it("skips a GPU whose Xid the daemon kept for this boot in state_dir, as the daemon does, and writes nothing", async () => {
    const env = { CGN_NVML_LIBRARY: buildFakeNvml(dir) }
    const stateDir = path.join(dir, "state")
    const record = path.join(stateDir, "gpu-xids.json")
    fs.mkdirSync(stateDir, { recursive: true })
    const bootId = fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    const text = `${JSON.stringify({
      bootId,
      gpus: [{ uuid: "GPU-00000000-1111-2222-3333-444444444444", xids: [{ xid: 79, events: 1 }] }]
    })}\n`
    fs.writeFileSync(record, text)
    const config = path.join(dir, "dev.toml")
    fs.writeFileSync(
      config,
      fs
        .readFileSync("examples/dev.toml", "utf8")
        .replace('state_dir = ".cgn-agent/state"', `state_dir = "${stateDir}"`)
    )
    const r = await runCli(["check", "--config", config], env)
    expect(r.code, r.stderr).toBe(0)
    expect(line(r.stdout, "gpus")).toBe("1 (automatic: the first tp x dp healthy GPUs now; picked again at start)")
    expect(r.stderr).toContain("a GPU reported Xids earlier in this boot")
    expect((await runCli(["render", "--config", config], env)).stdout).toContain("CUDA_VISIBLE_DEVICES=1")
    expect(fs.readFileSync(record, "utf8")).toBe(text)
  })
})

describe("check and the memory cgroup", () => {
  const plain = load('[models.m]\nhf_repo = "a/b"\n')

  it("prints the limit and where it was read; none, unknown, not read offline", () => {
    expect(line(summarize(plain, undefined, { version: "v2", limit: 256 * 2 ** 30 }), "memory limit")).toBe(
      "256.0 GiB (cgroup v2)"
    )
    expect(line(summarize(plain, undefined, { version: "v1", limit: "none" }), "memory limit")).toBe("none (cgroup v1)")
    expect(line(summarize(plain, undefined, { version: "v2", limit: undefined }), "memory limit")).toBe(
      "unknown (cgroup v2: the limit is unreadable)"
    )
    expect(line(summarize(plain, undefined, { version: undefined, limit: undefined }), "memory limit")).toBe(
      "unknown (no memory cgroup found)"
    )
    expect(line(summarize(plain), "memory limit")).toBe("not read (--offline)")
  })

  it.skipIf(!canCreateMemoryCgroup)(
    "inside a 512 MiB cgroup: the limit, and the warning on stderr with exit 0 (needs a memory cgroup it can create)",
    async () => {
      const cgroup = createMemoryCgroup(`cgn-check-${process.pid}`, 512 * 2 ** 20)
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-memory-"))
      try {
        const file = path.join(dir, "kvbm.toml")
        fs.writeFileSync(file, '[engine]\nkv_offload = "kvbm"\nkvbm_cpu_cache_gb = 1\n[models.m]\nhf_repo = "a/b"\n')
        const r = await runCli(["check", "--config", file], {}, cgroup.enter)
        expect(r.code, r.stderr).toBe(0)
        expect(line(r.stdout, "memory limit")).toBe(`512.0 MiB (cgroup ${cgroup.version})`)
        expect(r.stderr).toContain(
          "warning: the engine's CPU KV-cache tier (DYN_KVBM_CPU_CACHE_GB=1: 953.7 MiB) is at or above the memory " +
            "limit of the agent's cgroup (512.0 MiB)"
        )
        // LMCache with nothing set: its default 5 GiB per GPU worker (one here)
        const lmcache = path.join(dir, "lmcache.toml")
        fs.writeFileSync(lmcache, '[engine]\nkv_offload = "lmcache"\n[models.m]\nhf_repo = "a/b"\n')
        const byDefault = await runCli(["check", "--config", lmcache], {}, cgroup.enter)
        expect(byDefault.code, byDefault.stderr).toBe(0)
        expect(byDefault.stderr).toContain(
          "warning: the engine's CPU KV-cache tier (LMCache's default max_local_cpu_size of 5 (GiB): 5.0 GiB) is at " +
            "or above the memory limit of the agent's cgroup (512.0 MiB)"
        )
        const offline = await runCli(["check", "--offline", "--config", file], {}, cgroup.enter)
        expect(offline.code).toBe(0)
        expect(line(offline.stdout, "memory limit")).toBe("not read (--offline)")
        expect(offline.stderr).not.toContain("warning")
      } finally {
        await cgroup.remove()
        fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  )
})

describe("check and the engine's CPU KV-cache tier", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-cpu-cache-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))
  const config = (name: string, engine: string) => {
    const file = path.join(dir, name)
    fs.writeFileSync(file, `[engine]\n${engine}\n[models.m]\nhf_repo = "a/b"\ntp = 2\n`)
    return file
  }

  it("LMCache's from the file a container's env names, per GPU worker; HiCache's ratio unknown; none; offline", async () => {
    const yaml = path.join(dir, "lmcache.yaml")
    fs.writeFileSync(yaml, "chunk_size: 256\nmax_local_cpu_size: 20\n")
    const lmcache = config("lmcache.toml", 'kv_offload = "lmcache"')
    const r = await runCli(["check", "--config", lmcache], { LMCACHE_CONFIG_FILE: yaml })
    expect(r.code, r.stderr).toBe(0)
    expect(line(r.stdout, "cpu kv cache")).toBe(
      `40.0 GiB (max_local_cpu_size: 20 in ${yaml} (LMCACHE_CONFIG_FILE) per GPU worker x 2 (tp 2))`
    )
    const hicache = await runCli([
      "check",
      "--config",
      config("hicache.toml", 'kind = "sglang"\nkv_offload = "hicache"')
    ])
    expect(line(hicache.stdout, "cpu kv cache")).toMatch(/^unknown \(SGLang sizes its host pool as --hicache-ratio/)
    const none = await runCli([
      "check",
      "--config",
      config("none.toml", 'kv_offload = "nixl"\n[agent]\nrole = "prefill"')
    ])
    expect(line(none.stdout, "cpu kv cache"), none.stderr).toBe("none")
    // SGLang's LMCache is deliberately not sized: unknown, saying why (not "none": it may well hold host memory)
    const sglangLmcache = await runCli([
      "check",
      "--config",
      config("sglang-lmcache.toml", 'kind = "sglang"\nkv_offload = "lmcache"')
    ])
    expect(line(sglangLmcache.stdout, "cpu kv cache"), sglangLmcache.stderr).toMatch(
      /^unknown \(SGLang's LMCache is not sized here: /
    )
    const offline = await runCli(["check", "--offline", "--config", lmcache], { LMCACHE_CONFIG_FILE: yaml })
    expect(line(offline.stdout, "cpu kv cache")).toBe("not read (--offline)")
  })
})
