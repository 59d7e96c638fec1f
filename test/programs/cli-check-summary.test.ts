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
import {
  plaintextEngineKeyWarning,
  plaintextGrpcWarning,
  shortEngineKeyWarning
} from "../../src/layers/config/exposureWarnings.ts"
import { kvbmHasTier } from "../../src/layers/engine/backends/cpuCacheTiers.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { summarize } from "../../src/programs/check.ts"
import { commandProblem } from "../../src/programs/hostChecks.ts"
import { pathProblem } from "../../src/programs/modelPath.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { runCli } from "../support/cli.ts"
import { engineBinEnv } from "../support/engineBin.ts"
import { canCreateMemoryCgroup, createMemoryCgroup } from "../support/memoryCgroup.ts"
import { buildFakeNvml } from "../support/nvml.ts"
import { pollUntil } from "../support/poll.ts"

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

  it("a relative [kv].uds: where it is from run's working directory too (under systemd that is /)", () => {
    const s = summarize(load('[kv]\nevents = true\nuds = "run/kvcached.sock"\n[models.m]\nhf_repo = "a/b"\n'))
    expect(line(s, "kv events")).toBe(
      `on, tcp://127.0.0.1:5557, forwarded to run/kvcached.sock (${path.resolve("run/kvcached.sock")})`
    )
  })

  it("the shutdown's worst case, in terminationGracePeriodSeconds' unit (the example DaemonSet sets 180 for 157 s)", () => {
    const etcd = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n[engine]\nstop_grace = "60s"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(etcd), "shutdown")).toBe(
      "within 2m 37s, every peer hung (terminationGracePeriodSeconds: at least 157)"
    )
  })

  // rounded up, also below .5 s: a bound of 156.25 s needs 157 (README "Running the daemon", examples/k8s)
  it("the shutdown's seconds round up", () => {
    const etcd = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "59250ms"\n[engine]\nstop_grace = "60s"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(etcd), "shutdown")).toBe(
      "within 2m 36s 250ms, every peer hung (terminationGracePeriodSeconds: at least 157)"
    )
  })

  it("traces add their last flush and the SDK's shutdown; a [kv].uds with KV events off adds nothing", () => {
    const bound = (extra: string) =>
      line(
        summarize(
          load(
            `[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n${extra}\n[engine]\nstop_grace = "60s"\n[models.m]\nhf_repo = "a/b"\n`
          )
        ),
        "shutdown"
      )
    expect(bound('otlp_endpoint = "http://127.0.0.1:4318"')).toBe(
      "within 2m 40s 250ms, every peer hung (terminationGracePeriodSeconds: at least 161)"
    )
    expect(bound('[kv]\nevents = false\nuds = "/run/cgn/kvcached.sock"')).toBe(
      "within 2m 37s, every peer hung (terminationGracePeriodSeconds: at least 157)"
    )
  })

  it("KV events to kvcached add 1 s: the last call's cancel message, which effect's RpcClient waits 1 s for", () => {
    const kv = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n[engine]\nstop_grace = "60s"\n' +
        '[kv]\nevents = true\nuds = "/run/cgn/kvcached.sock"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(kv), "shutdown")).toBe(
      "within 2m 38s, every peer hung (terminationGracePeriodSeconds: at least 158)"
    )
  })

  it("KV events off", () => {
    expect(line(summarize(load('[models.m]\nhf_repo = "a/b"\n')), "kv events")).toBe("off")
  })

  it("automatic GPUs: the ones NVML gave the plan now, else said to be picked at start", () => {
    const c = load('[models.m]\nhf_repo = "a/b"\ntp = 2\n')
    const plan = { ...engineFor("vllm").render(c), gpus: [0, 1] }
    expect(line(summarize(c, plan), "gpus")).toBe(
      "0, 1 (automatic: the first tp x dp GPUs now, healthy ones first; picked again at start)"
    )
    expect(line(summarize(c), "gpus")).toBe("automatic (the first tp x dp healthy GPUs at start)")
  })

  it("the listeners, the cluster, the role and the GPUs the config lists", () => {
    const s = summarize(
      load(
        '[security]\nrequire_mtls = true\nca_file = "/ca.pem"\ncert_file = "/c.pem"\nkey_file = "/k.pem"\n' +
          '[agent]\nlisten_grpc = "127.0.0.1:7071"\nrole = "both"\n[models.m]\nhf_repo = "a/b"\ntp = 2\ngpus = [0, 1]\n'
      )
    )
    expect(["grpc", "health", "cluster", "role", "gpus"].map((key) => line(s, key))).toEqual([
      "127.0.0.1:7071 (mTLS)",
      "off",
      "standalone (no etcd)",
      "both",
      "0, 1"
    ])
    const health = summarize(load('[agent]\nlisten_health = "0.0.0.0:7073"\n[models.m]\nhf_repo = "a/b"\n'))
    expect(line(health, "health")).toBe("0.0.0.0:7073 (plaintext, health only)")
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

describe("check where NVML cannot be loaded", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-nonvml-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

  it("says the GPUs the config names were not checked against the host (it said ok as if they were)", async () => {
    const config = path.join(dir, "gpus.toml")
    fs.writeFileSync(
      config,
      `${fs.readFileSync("examples/dev.toml", "utf8").replace('state_dir = ".cgn-agent/state"', `state_dir = "${dir}/state"`)}`.replace(
        /\[models\.([^\]]+)\]\n/,
        (m) => `${m}gpus = [5]\n`
      )
    )
    const r = await runCli(["check", "--config", config], {
      CGN_NVML_LIBRARY: path.join(dir, "no-such-libnvidia-ml.so.1")
    })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).toMatch(
      /^warning: models\."[^"]+"\.gpus not checked against this host's GPUs: NVML is not available \(.+\)$/m
    )
    const render = await runCli(["render", "--config", config, "--json"], {
      CGN_NVML_LIBRARY: path.join(dir, "no-such-libnvidia-ml.so.1")
    })
    expect(render.code, render.stderr).toBe(0)
    expect(render.stderr).toMatch(/^warning: models\."[^"]+"\.gpus not checked against this host's GPUs/m)
    expect((JSON.parse(render.stdout) as { warnings: Array<string> }).warnings).toEqual([
      expect.stringMatching(/\.gpus not checked against this host's GPUs/)
    ])
  })
})

describe("check and render under the daemon's CGN_LOG_LEVEL (a `kubectl exec ... check` inherits it)", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-level-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

  it("keep NVML's info lines out of their output: stderr has the warnings alone, no JSON log line", async () => {
    const env = { CGN_LOG_LEVEL: "debug", CGN_NVML_LIBRARY: path.join(dir, "no-such-libnvidia-ml.so.1") }
    for (const args of [
      ["check", "--offline", "--config", "examples/dev.toml"],
      ["render", "--config", "examples/dev.toml"]
    ]) {
      const r = await runCli(args, env)
      expect(r.code, r.stderr).toBe(0)
      expect(r.stderr, args[0]).not.toContain('"level"')
    }
  })
})

describe("check on a host with NVML (a fake libnvidia-ml.so with two GPUs)", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-nvml-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

  it("NVML that fails to initialize: said once, without the daemon's 'retrying with backoff' (check looks once)", async () => {
    const r = await runCli(["check", "--config", "examples/dev.toml"], {
      CGN_NVML_LIBRARY: buildFakeNvml(dir),
      FAKE_NVML_INIT_RC: "999"
    })
    expect(r.code, r.stderr).toBe(0)
    const lines = r.stderr.split("\n").filter((l) => l.includes("NVML not available"))
    expect(lines).toHaveLength(1)
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: "warn", msg: "NVML not available; reporting no GPUs" })
  })

  it("names the GPUs an automatic assignment takes, as render's CUDA_VISIBLE_DEVICES does", async () => {
    const env = { CGN_NVML_LIBRARY: buildFakeNvml(dir) }
    const r = await runCli(["check", "--config", "examples/dev.toml"], env)
    expect(r.code, r.stderr).toBe(0)
    expect(line(r.stdout, "gpus")).toBe(
      "0 (automatic: the first tp x dp GPUs now, healthy ones first; picked again at start)"
    )
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
    expect(line(r.stdout, "gpus")).toBe(
      "1 (automatic: the first tp x dp GPUs now, healthy ones first; picked again at start)"
    )
    expect(r.stderr).toContain("a GPU reported Xids earlier in this boot")
    expect((await runCli(["render", "--config", config], env)).stdout).toContain("CUDA_VISIBLE_DEVICES=1")
    expect(fs.readFileSync(record, "utf8")).toBe(text)

    // both GPUs with a kept Xid: the choice takes a faulty one, and check says run would hold the engine on it
    const both = `${JSON.stringify({
      bootId,
      gpus: [
        { uuid: "GPU-00000000-1111-2222-3333-444444444444", xids: [{ xid: 79, events: 1 }] },
        { uuid: "GPU-55555555-6666-7777-8888-999999999999", xids: [{ xid: 48, events: 1 }] }
      ]
    })}\n`
    fs.writeFileSync(record, both)
    const held = await runCli(["check", "--config", config], env)
    expect(held.code, held.stderr).toBe(0)
    expect(line(held.stdout, "gpus")).toBe(
      "0 (automatic: the first tp x dp GPUs now, healthy ones first; picked again at start)"
    )
    expect(held.stderr).toContain(
      'warning: models."qwen2.5-0.5b".gpus: too few healthy GPUs; the automatic choice takes faulty ones (GPU 0 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot): the engine is held, the node unhealthy, until they clear'
    )
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
        const agent = `[agent]\nstate_dir = "${dir}/state"\n`
        const engines = engineBinEnv(dir)
        fs.writeFileSync(
          file,
          `${agent}[engine]\nkv_offload = "kvbm"\nkvbm_cpu_cache_gb = 1\n[models.m]\nhf_repo = "a/b"\n`
        )
        const r = await runCli(["check", "--config", file], engines, cgroup.enter)
        expect(r.code, r.stderr).toBe(0)
        expect(line(r.stdout, "memory limit")).toBe(`512.0 MiB (cgroup ${cgroup.version})`)
        expect(r.stderr).toContain(
          "warning: the engine's CPU KV-cache tier (DYN_KVBM_CPU_CACHE_GB=1: 953.7 MiB) is at or above the memory " +
            "limit of the agent's cgroup (512.0 MiB)"
        )
        // LMCache with nothing set: its default 5 GiB per GPU worker (one here)
        const lmcache = path.join(dir, "lmcache.toml")
        fs.writeFileSync(lmcache, `${agent}[engine]\nkv_offload = "lmcache"\n[models.m]\nhf_repo = "a/b"\n`)
        const byDefault = await runCli(["check", "--config", lmcache], engines, cgroup.enter)
        expect(byDefault.code, byDefault.stderr).toBe(0)
        expect(byDefault.stderr).toContain(
          "warning: the engine's CPU KV-cache tier (LMCache's default max_local_cpu_size of 5 (GiB): 5.0 GiB) is at " +
            "or above the memory limit of the agent's cgroup (512.0 MiB)"
        )
        const offline = await runCli(["check", "--offline", "--config", file], {}, cgroup.enter)
        expect(offline.code).toBe(0)
        expect(line(offline.stdout, "memory limit")).toBe("not read (--offline)")
        expect(offline.stderr).not.toContain("CPU KV-cache")
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
  const config = (name: string, engine: string, agent = "") => {
    const file = path.join(dir, name)
    fs.writeFileSync(
      file,
      `[agent]\nstate_dir = "${dir}/state"\n${agent}\n[engine]\n${engine}\n[models.m]\nhf_repo = "a/b"\ntp = 2\n`
    )
    return file
  }
  // the engines' executables on PATH: check refuses an engine it cannot find
  const engines = engineBinEnv(dir)

  it("LMCache's from the file a container's env names, per GPU worker; HiCache's ratio unknown; none; offline", async () => {
    const yaml = path.join(dir, "lmcache.yaml")
    fs.writeFileSync(yaml, "chunk_size: 256\nmax_local_cpu_size: 20\n")
    const lmcache = config("lmcache.toml", 'kv_offload = "lmcache"')
    const r = await runCli(["check", "--config", lmcache], { LMCACHE_CONFIG_FILE: yaml, ...engines })
    expect(r.code, r.stderr).toBe(0)
    expect(line(r.stdout, "cpu kv cache")).toBe(
      `40.0 GiB (max_local_cpu_size: 20 in ${yaml} (LMCACHE_CONFIG_FILE) per GPU worker x 2 (tp 2))`
    )
    const hicache = await runCli(
      ["check", "--config", config("hicache.toml", 'kind = "sglang"\nkv_offload = "hicache"')],
      engines
    )
    expect(line(hicache.stdout, "cpu kv cache")).toMatch(/^unknown \(SGLang sizes its host pool as --hicache-ratio/)
    const none = await runCli(
      ["check", "--config", config("none.toml", 'kv_offload = "nixl"', 'role = "prefill"')],
      engines
    )
    expect(line(none.stdout, "cpu kv cache"), none.stderr).toBe("none")
    // SGLang's LMCache is deliberately not sized: unknown, saying why (not "none": it may well hold host memory)
    const sglangLmcache = await runCli(
      ["check", "--config", config("sglang-lmcache.toml", 'kind = "sglang"\nkv_offload = "lmcache"')],
      engines
    )
    expect(line(sglangLmcache.stdout, "cpu kv cache"), sglangLmcache.stderr).toMatch(
      /^unknown \(SGLang's LMCache is not sized here: /
    )
    const offline = await runCli(["check", "--offline", "--config", lmcache], { LMCACHE_CONFIG_FILE: yaml })
    expect(line(offline.stdout, "cpu kv cache")).toBe("not read (--offline)")
  })
})

describe("check finds on the host what run would find only by failing", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-check-host-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))
  const engines = engineBinEnv(dir)
  const config = (name: string, body: string, stateDir = `${dir}/state`) => {
    const file = path.join(dir, name)
    fs.writeFileSync(file, `[agent]\nstate_dir = "${stateDir}"\n${body}\n[models.m]\nhf_repo = "a/b"\n`)
    return file
  }

  it("an engine executable that is not there: exit 2 with the key, as spawn would find it; not for openai_compat", async () => {
    const missing = await runCli([
      "check",
      "--config",
      config("missing.toml", '[engine]\ncommand = ["/nonexistent/vllm"]')
    ])
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain(
      'engine.command[0] = "/nonexistent/vllm": /nonexistent/vllm does not exist; run could not spawn the engine'
    )
    // the default executable, searched in the engine's PATH (here one without it)
    const empty = path.join(dir, "empty-bin")
    fs.mkdirSync(empty, { recursive: true })
    const bare = config("default.toml", "")
    const notOnPath = await runCli(["check", "--config", bare], { PATH: empty })
    expect(notOnPath.code).toBe(2)
    expect(notOnPath.stderr).toContain(
      `engine.kind = "vllm" runs "vllm" (engine.command is unset): not found on the engine's PATH (${empty})`
    )
    // [engine].env's PATH is the engine's: it finds it there
    const viaEnv = config("env-path.toml", `[engine.env]\nPATH = "${engines.PATH}"`)
    expect((await runCli(["check", "--config", viaEnv], { PATH: empty })).code).toBe(0)
    const found = await runCli(["check", "--config", bare], engines)
    expect(found.code, found.stderr).toBe(0)
    // a file that is not executable is refused too
    const plain = path.join(dir, "not-executable")
    fs.writeFileSync(plain, "#!/bin/sh\n", { mode: 0o644 })
    const notExec = await runCli(["check", "--config", config("plain.toml", `[engine]\ncommand = ["${plain}"]`)])
    // (root too: an execute bit is needed for X_OK, access(2))
    expect(notExec.code).toBe(2)
    expect(notExec.stderr).toContain(`${plain} is not executable`)
    // a proxied server starts nothing; --offline checks a config away from its host
    const proxied = config("proxied.toml", '[engine]\nkind = "openai_compat"\nurl = "http://10.0.0.1:8000"')
    expect((await runCli(["check", "--config", proxied], { PATH: empty })).code).toBe(0)
    expect((await runCli(["check", "--offline", "--config", bare], { PATH: empty })).code).toBe(0)
  })

  // hostChecks.ts commandProblem: found as libuv's spawn finds it (execvp), so that check says ok only where spawn works
  it("the engine's command is searched as spawn searches it: a directory of its name is not it; no PATH is /usr/bin:/bin", async () => {
    // a directory passes access(X_OK) but spawn fails EACCES on it, and run would restart it for ever
    const bin = path.join(dir, "dir-bin")
    fs.mkdirSync(path.join(bin, "vllm"), { recursive: true })
    expect(await commandProblem("vllm", { PATH: bin }, "/")).toBe(`not found on the engine's PATH (${bin})`)
    expect(await commandProblem(path.join(bin, "vllm"), {}, "/")).toBe(`${path.join(bin, "vllm")} is not a file`)
    // no PATH in the engine's environment: libuv's default (_PATH_DEFPATH), where sh is
    expect(await commandProblem("sh", {}, "/")).toBeUndefined()
    // an empty PATH entry is the working directory
    const cwd = path.join(dir, "cwd-bin")
    fs.mkdirSync(cwd, { recursive: true })
    fs.writeFileSync(path.join(cwd, "myengine"), "#!/bin/sh\n", { mode: 0o755 })
    expect(await commandProblem("myengine", { PATH: ":/nonexistent" }, cwd)).toBeUndefined()
    // a path through a file (ENOTDIR) is one that does not exist, as ENOENT
    expect(await commandProblem("/etc/passwd/vllm", {}, "/")).toBe("/etc/passwd/vllm does not exist")
  })

  // SGLang runs `python -m sglang.launch_server`: a python on the PATH without the package would die at every start
  it("an engine run as `python -m package.module`: a python without the package is exit 2 naming it", async () => {
    const config = (name: string) => {
      const file = path.join(dir, name)
      fs.writeFileSync(
        file,
        `[agent]\nstate_dir = "${dir}/state"\n[engine]\nkind = "sglang"\n[models.m]\nhf_repo = "o/m"\n`
      )
      return file
    }
    const bin = (name: string, script: string) => {
      const b = path.join(dir, name)
      fs.mkdirSync(b, { recursive: true })
      fs.writeFileSync(path.join(b, "python"), script, { mode: 0o755 })
      return { PATH: `${b}${path.delimiter}${process.env.PATH ?? ""}` }
    }
    // importlib's answer as the check asks it (exit 3: not found), from a stand-in interpreter
    const missing = await runCli(
      ["check", "--config", config("sglang-missing.toml")],
      bin("py-missing", "#!/bin/sh\nexit 3\n")
    )
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain(
      'engine.kind = "sglang" runs "python" (engine.command is unset): that python has no module sglang (importlib could not find it)'
    )
    const broken = await runCli(
      ["check", "--config", config("sglang-broken.toml")],
      bin("py-broken", "#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    )
    expect(broken.code, broken.stderr).toBe(0)
    expect(broken.stderr).toContain(
      "could not ask python whether it has the module sglang: Fatal Python error: init_fs_encoding"
    )
    const found = await runCli(
      ["check", "--config", config("sglang-found.toml")],
      bin("py-found", "#!/bin/sh\nexit 0\n")
    )
    expect(found.code, found.stderr).toBe(0)
    // one that never answers: a warning at its own bound (not the filesystems' error), and it is killed
    const pidFile = path.join(dir, "py-hung.pid")
    const hung = await runCli(
      ["check", "--config", config("sglang-hung.toml")],
      bin("py-hung", `#!/bin/sh\necho $$ > ${pidFile}\nexec sleep 60\n`)
    )
    expect(hung.code, hung.stderr).toBe(0)
    expect(hung.stderr).toContain("could not ask python whether it has the module sglang: no answer within 5 s")
    const pid = Number(fs.readFileSync(pidFile, "utf8"))
    await pollUntil("the hung python killed", () => {
      try {
        process.kill(pid, 0)
        return false
      } catch {
        return true
      }
    })
  })

  // pythonModule.ts isPython: engine.command's python is asked as the engine's own is; a program that is not a python
  // is never run with the question, whatever its argv[1]
  it("engine.command naming a python (a virtual environment's) is asked for the module; another program is not run", async () => {
    const venv = path.join(dir, "venv", "bin")
    fs.mkdirSync(venv, { recursive: true })
    const asked = path.join(dir, "asked")
    fs.writeFileSync(path.join(venv, "python3.12"), `#!/bin/sh\necho "$@" >> ${asked}\nexit 3\n`, { mode: 0o755 })
    fs.writeFileSync(path.join(venv, "numactl"), `#!/bin/sh\necho "$@" >> ${asked}\nexit 3\n`, { mode: 0o755 })
    const config = (name: string, command: ReadonlyArray<string>) => {
      const file = path.join(dir, name)
      fs.writeFileSync(
        file,
        `[agent]\nstate_dir = "${dir}/state"\n[engine]\nkind = "sglang"\ncommand = ${JSON.stringify(command)}\n[models.m]\nhf_repo = "o/m"\n`
      )
      return file
    }
    const python = path.join(venv, "python3.12")
    const venvPython = await runCli([
      "check",
      "--config",
      config("venv-python.toml", [python, "-m", "sglang.launch_server"])
    ])
    expect(venvPython.code).toBe(2)
    expect(venvPython.stderr).toContain(`engine.command[0] = "${python}": that ${python} has no module sglang`)
    expect(fs.readFileSync(asked, "utf8")).toMatch(/ sglang\n$/)
    fs.rmSync(asked)
    const numactl = path.join(venv, "numactl")
    const other = await runCli([
      "check",
      "--config",
      config("numactl.toml", [numactl, "-m", "0", "python3", "-m", "sglang.launch_server"])
    ])
    expect(other.code, other.stderr).toBe(0)
    expect(fs.existsSync(asked), "numactl was run").toBe(false)
  })

  it.skipIf(!fs.existsSync("/usr/bin/python3"))(
    "a real python3: without the package exit 2, with it on PYTHONPATH ok",
    async () => {
      const b = path.join(dir, "py-real")
      fs.mkdirSync(b, { recursive: true })
      fs.symlinkSync("/usr/bin/python3", path.join(b, "python"))
      const pkgs = path.join(dir, "py-packages")
      fs.mkdirSync(path.join(pkgs, "sglang"), { recursive: true })
      fs.writeFileSync(path.join(pkgs, "sglang", "__init__.py"), "")
      const file = (name: string, env: string) => {
        const f = path.join(dir, name)
        fs.writeFileSync(
          f,
          `[agent]\nstate_dir = "${dir}/state"\n[engine]\nkind = "sglang"\n${env}\n[models.m]\nhf_repo = "o/m"\n`
        )
        return f
      }
      const PATH = `${b}${path.delimiter}${process.env.PATH ?? ""}`
      const without = await runCli(["check", "--config", file("real-without.toml", "")], { PATH })
      expect(without.code).toBe(2)
      expect(without.stderr).toContain("that python has no module sglang")
      const withIt = await runCli(["check", "--config", file("real-with.toml", `env = { PYTHONPATH = "${pkgs}" }`)], {
        PATH
      })
      expect(withIt.code, withIt.stderr).toBe(0)
    }
  )

  it("a models path the engine cannot load is exit 2 naming the key: a GGUF file for llama.cpp, a model directory (or GGUF) for vLLM", async () => {
    const model = (name: string, kind: string, modelPath: string, engine = "") => {
      const file = path.join(dir, name)
      const body = `[agent]\nstate_dir = "${dir}/state"\n[engine]\nkind = "${kind}"\n${engine}\n[models."m.1"]\npath = "${modelPath}"\n`
      fs.writeFileSync(file, body)
      return file
    }
    const models = path.join(dir, "models")
    fs.mkdirSync(path.join(models, "hf"), { recursive: true })
    fs.writeFileSync(path.join(models, "tiny.gguf"), "GGUF\u0003")
    fs.writeFileSync(path.join(models, "weights.bin"), "not gguf")
    fs.writeFileSync(path.join(models, "named-oddly"), "GGUF\u0003")
    const check = (file: string) => runCli(["check", "--config", file], engines)
    // llama.cpp: the crash loop of the on-call walkthrough (a GGUF file not there yet), found before run
    const absent = await check(model("llama-absent.toml", "llama_cpp", `${models}/absent.gguf`))
    expect(absent.code).toBe(2)
    expect(absent.stderr).toContain(
      `models."m.1".path = "${models}/absent.gguf": ${models}/absent.gguf does not exist; llama-server needs an existing, readable GGUF file on this host and would exit at every start`
    )
    const dirForLlama = await check(model("llama-dir.toml", "llama_cpp", `${models}/hf`))
    expect(dirForLlama.code).toBe(2)
    expect(dirForLlama.stderr).toContain(`${models}/hf is a directory, not a file`)
    const llama = await check(model("llama-ok.toml", "llama_cpp", `${models}/tiny.gguf`))
    expect(llama.code, llama.stderr).toBe(0)
    // vLLM: a model directory, or one GGUF file (by its name or its magic); a path that is not there is refused
    const vllmAbsent = await check(model("vllm-absent.toml", "vllm", `${models}/Qwen2.5-0.5B`))
    expect(vllmAbsent.code).toBe(2)
    expect(vllmAbsent.stderr).toContain(
      `models."m.1".path = "${models}/Qwen2.5-0.5B": ${models}/Qwen2.5-0.5B does not exist; vLLM needs an existing, readable model directory (or one GGUF file)`
    )
    const notGguf = await check(model("vllm-bin.toml", "vllm", `${models}/weights.bin`))
    expect(notGguf.code).toBe(2)
    expect(notGguf.stderr).toContain(`${models}/weights.bin is a file but not a GGUF file`)
    for (const ok of [`${models}/hf`, `${models}/tiny.gguf`, `${models}/named-oddly`]) {
      const r = await check(model("vllm-ok.toml", "vllm", ok))
      expect(r.code, `${ok}: ${r.stderr}`).toBe(0)
    }
    // an engine.command may run the engine where the path is another (a container): a warning then
    const wrapped = await check(
      model("llama-wrapped.toml", "llama_cpp", "/models/in-the-container.gguf", 'command = ["llama-server"]')
    )
    expect(wrapped.code, wrapped.stderr).toBe(0)
    expect(wrapped.stderr).toContain(
      'warning: models."m.1".path = "/models/in-the-container.gguf": /models/in-the-container.gguf does not exist'
    )
    // away from the host nothing is read
    const offline = await runCli(["check", "--offline", "--config", model("off.toml", "llama_cpp", "/nope.gguf")])
    expect(offline.code, offline.stderr).toBe(0)
  })

  // modelPath.ts pathProblem, on what the CLI test above does not reach: each engine's reading of the path
  it("a models path: a device is no model; mlx wants a directory; vLLM takes *.gguf by its name; a path through a file does not exist", async () => {
    expect(await pathProblem("/dev/null", "gguf-file")).toBe("/dev/null is neither a file nor a directory")
    const weights = path.join(dir, "weights.safetensors")
    fs.writeFileSync(weights, "x")
    expect(await pathProblem(weights, "directory")).toBe(`${weights} is a file, not a model directory`)
    // check_gguf_file: a file named *.gguf, or one starting with the magic
    const named = path.join(dir, "no-magic.gguf")
    fs.writeFileSync(named, "not magic")
    expect(await pathProblem(named, "directory-or-gguf")).toBeUndefined()
    // llama-server reads the magic whatever the name: it exits 1 at every start on such a file
    expect(await pathProblem(named, "gguf-file")).toBe(`${named} is not a GGUF file (it does not start with "GGUF")`)
    expect(await pathProblem("/etc/passwd/m.gguf", "gguf-file")).toBe("/etc/passwd/m.gguf does not exist")
  })

  it("a state_dir that cannot be made (under /proc, below a file) is exit 2; one that can is not made by check", async () => {
    const proc = await runCli(["check", "--config", config("proc.toml", "", "/proc/cgn-agent/state")], engines)
    expect(proc.code).toBe(2)
    expect(proc.stderr).toContain(
      'agent.state_dir = "/proc/cgn-agent/state": /proc is on procfs (a kernel filesystem): nothing can be kept there'
    )
    const file = path.join(dir, "a-file")
    fs.writeFileSync(file, "")
    const below = await runCli(["check", "--config", config("below.toml", "", `${file}/state`)], engines)
    expect(below.code).toBe(2)
    expect(below.stderr).toContain(`${file} is not a directory, so ${file}/state cannot be made`)
    // a symbolic link to a missing target, itself or on the way (run cannot make it: it was exit 0 here)
    const dangling = path.join(dir, "dangling")
    fs.symlinkSync(path.join(dir, "gone"), dangling)
    for (const [name, at, why] of [
      ["dangling.toml", dangling, `${dangling} is a symbolic link to a missing target`],
      [
        "dangling-below.toml",
        `${dangling}/state`,
        `${dangling} is a symbolic link to a missing target, so ${dangling}/state cannot be made`
      ]
    ] as const) {
      const r = await runCli(["check", "--config", config(name, "", at)], engines)
      expect([r.code, r.stderr]).toEqual([2, expect.stringContaining(`agent.state_dir = "${at}": ${why}`)])
    }
    const fresh = path.join(dir, "not-yet", "state")
    const ok = await runCli(["check", "--config", config("fresh.toml", "", fresh)], engines)
    expect(ok.code, ok.stderr).toBe(0)
    expect(line(ok.stdout, "state dir")).toBe(fresh)
    expect(fs.existsSync(path.join(dir, "not-yet"))).toBe(false)
    // a proxied server keeps only the cordon there: a warning
    const proxied = await runCli([
      "check",
      "--config",
      config("proxied-proc.toml", '[engine]\nkind = "openai_compat"\nurl = "http://10.0.0.1:8000"', "/proc/x")
    ])
    expect(proxied.code).toBe(0)
    expect(proxied.stderr).toContain('warning: agent.state_dir = "/proc/x": /proc is on procfs')
  })

  // The security review (FINDINGS.md, item 3d): a 0777 state_dir was used without a word, and as root the agent
  // trusts what is there (the engine pid file names a group it stops).
  it("a state_dir others can write is refused by check and by run (exit 2, naming the key and why)", async () => {
    const open = path.join(dir, "open-state")
    fs.mkdirSync(open)
    fs.chmodSync(open, 0o777)
    const file = config("open.toml", "", open)
    const refusal = `agent.state_dir = "${open}" is not the agent's own: ${open} is writable by its group and others (mode 0777)`
    const checked = await runCli(["check", "--config", file], engines)
    expect(checked.code).toBe(2)
    expect(checked.stderr).toContain(refusal)
    expect(checked.stderr).toContain("writable by its owner only (chmod 700)")
    // run makes the same preflight before it starts anything (loopback ports: nothing listens if it did start)
    const runFile = path.join(dir, "open-run.toml")
    fs.writeFileSync(
      runFile,
      `[agent]\nstate_dir = "${open}"\nlisten_grpc = "127.0.0.1:0"\nlisten_admin = "127.0.0.1:0"\n[models.m]\nhf_repo = "a/b"\n`
    )
    const ran = await runCli(["run", "--config", runFile], engines)
    expect(ran.code, ran.stderr).toBe(2)
    expect(ran.stderr).toContain(refusal)
    fs.chmodSync(open, 0o700)
    const ok = await runCli(["check", "--config", file], engines)
    expect(ok.code, ok.stderr).toBe(0)
  })

  // README: `check` reports "every problem of the file and of the host ..., one per line": a preflight problem (the
  // state_dir above) does not hide the host's (the engine's executable) until it is fixed
  it("a preflight problem and a host problem of one file: both reported in one run", async () => {
    const open = path.join(dir, "open-state-and-engine")
    fs.mkdirSync(open)
    fs.chmodSync(open, 0o777)
    const r = await runCli([
      "check",
      "--config",
      config("both.toml", '[engine]\ncommand = ["/nonexistent/vllm"]', open)
    ])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain(`agent.state_dir = "${open}" is not the agent's own`)
    expect(r.stderr).toContain('engine.command[0] = "/nonexistent/vllm": /nonexistent/vllm does not exist')
  })

  it("gRPC in plaintext off loopback: a warning (the default runs), none on loopback or with mTLS", async () => {
    const open = await runCli(["check", "--offline", "--config", config("grpc-open.toml", "")])
    expect(open.code, open.stderr).toBe(0)
    expect(open.stderr).toContain(
      "warning: gRPC listens on 0.0.0.0:7071 (agent.listen_grpc) without TLS: anyone who reaches the port can run Generate"
    )
    const loopback = path.join(dir, "grpc-loopback.toml")
    fs.writeFileSync(
      loopback,
      `[agent]\nlisten_grpc = "127.0.0.1:7071"\nstate_dir = "${dir}/state"\n[models.m]\nhf_repo = "a/b"\n`
    )
    const quiet = await runCli(["check", "--offline", "--config", loopback])
    expect(quiet.code, quiet.stderr).toBe(0)
    expect(quiet.stderr).not.toContain("gRPC listens")
    const mtls = load(
      '[security]\nrequire_mtls = true\nca_file = "/ca.pem"\ncert_file = "/c.pem"\nkey_file = "/k.pem"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(plaintextGrpcWarning(mtls)).toBeUndefined()
  })

  it("the plaintext-gRPC warning advises what restricts a hostNetwork pod's port, as the README does", () => {
    expect(plaintextGrpcWarning(load('[models.m]\nhf_repo = "a/b"\n'))).toBe(
      "gRPC listens on 0.0.0.0:7071 (agent.listen_grpc) without TLS: anyone who reaches the port can run Generate on " +
        "the engine, unauthenticated; set [security] require_mtls = true (with a CA of its own), or restrict the port: " +
        "bind listen_grpc to one interface's address, or filter the port in the host's firewall (a NetworkPolicy does " +
        "not restrict a hostNetwork pod in most CNIs)"
    )
  })

  it("engine.api_key sent over plain HTTP off the host is warned of; https, loopback and a spawned engine are not", async () => {
    const proxied = (url: string) =>
      load(`[engine]\nkind = "openai_compat"\nurl = "${url}"\napi_key = "k"\n[models.m]\nhf_repo = "a/b"\n`)
    expect(plaintextEngineKeyWarning(proxied("http://10.0.3.7:8000"))).toBe(
      "engine.api_key goes to 10.0.3.7:8000 (engine.url) over plain HTTP: anyone on the network path can read it and " +
        "use the server with it; give the server an https:// URL"
    )
    for (const url of ["https://10.0.3.7:8443", "http://127.0.0.1:8000", "http://[::1]:8000", "http://localhost:8000"])
      expect(plaintextEngineKeyWarning(proxied(url)), url).toBeUndefined()
    const spawned = load('[engine]\nurl = "http://10.0.3.7:8000"\napi_key = "k"\n[models.m]\nhf_repo = "a/b"\n')
    expect(plaintextEngineKeyWarning(spawned)).toBeUndefined()
    expect(
      plaintextEngineKeyWarning(
        load('[engine]\nkind = "openai_compat"\nurl = "http://10.0.3.7:8000"\n[models.m]\nhf_repo = "a/b"\n')
      )
    ).toBeUndefined()
    const file = path.join(dir, "key-plain.toml")
    fs.writeFileSync(
      file,
      `[agent]\nlisten_grpc = "127.0.0.1:7071"\nstate_dir = "${dir}/state"\n[engine]\nkind = "openai_compat"\nurl = "http://10.0.3.7:8000"\napi_key = "k"\n[models.m]\nhf_repo = "a/b"\n`
    )
    const r = await runCli(["check", "--offline", "--config", file])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).toContain("warning: engine.api_key goes to 10.0.3.7:8000 (engine.url) over plain HTTP")
  })

  it("an engine.api_key under 6 characters is warned of (not scrubbed from the engine's output); 6 is not", async () => {
    const keyed = (key: string) => load(`[engine]\napi_key = "${key}"\n[models.m]\nhf_repo = "a/b"\n`)
    expect(shortEngineKeyWarning(keyed("k"))).toBe(
      "engine.api_key is 1 character: guessable, and too short to be told from other text, so not scrubbed from the " +
        "engine's output (values of 6 characters or more are); use a long random key"
    )
    expect(shortEngineKeyWarning(keyed("12345"))).toMatch(/^engine\.api_key is 5 characters: /)
    expect(shortEngineKeyWarning(keyed("123456"))).toBeUndefined()
    expect(shortEngineKeyWarning(load('[models.m]\nhf_repo = "a/b"\n'))).toBeUndefined()
    const file = path.join(dir, "key-short.toml")
    fs.writeFileSync(
      file,
      `[agent]\nlisten_grpc = "127.0.0.1:7071"\nstate_dir = "${dir}/state"\n[engine]\napi_key = "abc"\n[models.m]\nhf_repo = "a/b"\n`
    )
    const r = await runCli(["check", "--offline", "--config", file])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).toContain("warning: engine.api_key is 3 characters: guessable")
  })

  it('kv_offload = "kvbm" with no cache tier: exit 2 naming the keys; a tier in [engine].env will do', async () => {
    const none = await runCli(["check", "--config", config("kvbm.toml", '[engine]\nkv_offload = "kvbm"')], engines)
    expect(none.code).toBe(2)
    expect(none.stderr).toContain('engine.kv_offload = "kvbm" with no cache tier: KVBM refuses to start without one')
    expect(none.stderr).toContain("set engine.kvbm_cpu_cache_gb or engine.kvbm_disk_cache_gb")
    const disk = config("kvbm-disk.toml", '[engine]\nkv_offload = "kvbm"\nkvbm_disk_cache_gb = 50')
    expect((await runCli(["check", "--config", disk], engines)).code).toBe(0)
    const env = config("kvbm-env.toml", '[engine]\nkv_offload = "kvbm"\n[engine.env]\nDYN_KVBM_CPU_CACHE_GB = "8"')
    expect((await runCli(["check", "--config", env], engines)).code).toBe(0)
    // the agent's own environment (a container's env:) is the engine's too
    const fromAgent = await runCli(["check", "--config", config("kvbm-bare.toml", '[engine]\nkv_offload = "kvbm"')], {
      ...engines,
      DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS: "1000"
    })
    expect(fromAgent.code, fromAgent.stderr).toBe(0)
    // away from the host, the host's environment may still set one: a warning
    const offline = await runCli([
      "check",
      "--offline",
      "--config",
      config("kvbm-off.toml", '[engine]\nkv_offload = "kvbm"')
    ])
    expect(offline.code).toBe(0)
    expect(offline.stderr).toContain('warning: engine.kv_offload = "kvbm" with no cache tier')
  })

  // leader.rs KvbmLeaderConfig::sanity_check: a tier is a size or block count above 0, or object storage with blocks
  it("KVBM's tiers in the engine's environment: 0 is none; disk blocks and object offload (1 or true) are tiers", () => {
    expect(kvbmHasTier({ DYN_KVBM_CPU_CACHE_GB: "0" })).toBe(false)
    expect(kvbmHasTier({ DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS: "100" })).toBe(true)
    for (const on of ["1", "true", "TRUE"])
      expect(kvbmHasTier({ DYN_KVBM_USE_OBJECT_OFFLOAD: on, DYN_KVBM_OBJECT_NUM_BLOCKS: "10" }), on).toBe(true)
    expect(kvbmHasTier({ DYN_KVBM_USE_OBJECT_OFFLOAD: "1", DYN_KVBM_OBJECT_NUM_BLOCKS: "0" })).toBe(false)
    expect(kvbmHasTier({ DYN_KVBM_USE_OBJECT_OFFLOAD: "0", DYN_KVBM_OBJECT_NUM_BLOCKS: "10" })).toBe(false)
  })

  it("the summary shows the advertised address with what decided it, and state_dir", () => {
    const interfaces = { eth0: [{ address: "10.9.8.7", family: "IPv4", internal: false }] }
    const text = '[agent]\nlisten_grpc = "0.0.0.0:7071"\nstate_dir = "rel/state"\n[models.m]\nhf_repo = "a/b"\n'
    const wildcard = summarize(load(text), undefined, undefined, undefined, interfaces)
    expect(line(wildcard, "advertise")).toBe("10.9.8.7:7071 (the first external IPv4 address of this host)")
    expect(line(wildcard, "state dir")).toBe(`rel/state (${path.resolve("rel/state")})`)
    expect(line(summarize(load(text), undefined, undefined, undefined, {}), "advertise")).toBe(
      "127.0.0.1:7071 (no external IPv4 address on this host)"
    )
    const fromNodeIp = decodeConfig(text, "summary.toml", { NODE_IP: "10.1.2.3" })
    if (Result.isFailure(fromNodeIp)) throw new Error(fromNodeIp.failure.message)
    expect(line(summarize(fromNodeIp.success, undefined, undefined, undefined, interfaces), "advertise")).toBe(
      "10.1.2.3:7071 (NODE_IP)"
    )
    const set = load('[agent]\nadvertise_addr = "node-7.example:7071"\n[models.m]\nhf_repo = "a/b"\n')
    expect(line(summarize(set, undefined, undefined, undefined, interfaces), "advertise")).toBe(
      "node-7.example:7071 (agent.advertise_addr)"
    )
    const port0 = load('[agent]\nlisten_grpc = "127.0.0.1:0"\n[models.m]\nhf_repo = "a/b"\n')
    expect(line(summarize(port0, undefined, undefined, undefined, interfaces), "advertise")).toBe(
      "127.0.0.1:0 (listen_grpc's host; port 0: the port listen_grpc binds at start)"
    )
    expect(line(summarize(port0), "state dir")).toBe("/var/lib/cgn-agent")
  })
})

describe("render where NVML cannot be loaded and the config names no GPUs", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-render-nonvml-"))
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

  it("no warning: there are no named GPUs to check (the automatic choice is made at start)", async () => {
    const config = path.join(dir, "auto.toml")
    fs.writeFileSync(
      config,
      fs
        .readFileSync("examples/dev.toml", "utf8")
        .replace('state_dir = ".cgn-agent/state"', `state_dir = "${dir}/state"`)
    )
    const r = await runCli(["render", "--config", config, "--json"], {
      CGN_NVML_LIBRARY: path.join(dir, "no-such-libnvidia-ml.so.1")
    })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).not.toContain("not checked against this host's GPUs")
    expect((JSON.parse(r.stdout) as { warnings?: Array<string> }).warnings).toBeUndefined()
  })
})
