// `cgn-agent check`'s summary: it shows dp next to tp; the GPUs an automatic assignment takes on this host (check
// resolves them through NVML, as run does), and none for an engine the agent hands no GPUs (mlx, openai_compat);
// and whether the KV events the engine publishes reach cgn-kvcached (`run` forwards them only to a `[kv].uds`).
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

  it("the shutdown's worst case, in terminationGracePeriodSeconds' unit (the example DaemonSet sets 180 for 153.75 s)", () => {
    const etcd = load(
      '[cluster]\netcd = ["http://etcd:2379"]\n[agent]\ndrain_timeout = "60s"\n[engine]\nstop_grace = "60s"\n[models.m]\nhf_repo = "a/b"\n'
    )
    expect(line(summarize(etcd), "shutdown")).toBe(
      "within 2m 33s 750ms, every peer hung (terminationGracePeriodSeconds: at least 154)"
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
})
