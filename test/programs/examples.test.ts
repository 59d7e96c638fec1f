// Every examples/*.toml must pass `check` and render; the production example must render the command
// the issue promises (vLLM, tensor parallelism 4, the NIXL connector), and the role pairs must match.
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { preflight } from "../../src/programs/check.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"

const DIR = path.join(import.meta.dirname, "..", "..", "examples")
const files = fs
  .readdirSync(DIR)
  .filter((f) => f.endsWith(".toml"))
  .sort()

const load = (name: string): AgentConfig => {
  const file = path.join(DIR, name)
  const r = decodeConfig(fs.readFileSync(file, "utf8"), file, {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

describe("examples", () => {
  it("the issue's examples are all there", () => {
    expect(files).toEqual(
      [
        "dev.toml",
        "llama-cpp.toml",
        "mlx.toml",
        "openai-compat.toml",
        "prod.toml",
        "sglang-decode.toml",
        "sglang-hicache.toml",
        "sglang-prefill.toml",
        "vllm-decode.toml",
        "vllm-prefill.toml"
      ].sort()
    )
  })

  it.each(files)("%s passes check (offline) and renders", async (name) => {
    const c = load(name)
    await Effect.runPromise(preflight(c, { offline: true }))
    const plan = engineFor(c.engine.kind).render(c)
    expect(plan.kind).toBe(c.engine.kind)
    expect(plan.spawns ? plan.argv.length > 0 : plan.argv.length === 0).toBe(true)
  })

  it("prod.toml: vLLM, Llama 3 70B, tp 4, NIXL, mTLS, etcd, KV events", () => {
    const c = load("prod.toml")
    const argv = engineFor(c.engine.kind).render(c).argv
    expect(argv.slice(0, 3)).toEqual(["vllm", "serve", "meta-llama/Meta-Llama-3-70B-Instruct"])
    expect(argv.join(" ")).toContain("--tensor-parallel-size 4")
    expect(argv[argv.indexOf("--kv-transfer-config") + 1]).toContain('"kv_connector":"NixlConnector"')
    expect(argv).toContain("--kv-events-config")
    expect(c.security).toMatchObject({
      require_mtls: true,
      ca_file: "/etc/cgn/tls/ca.crt",
      cert_file: "/etc/cgn/tls/tls.crt",
      key_file: "/etc/cgn/tls/tls.key"
    })
    expect(c.cluster.etcd.every((u) => u.startsWith("https://"))).toBe(true)
    expect(c.kv.uds).toBe("/run/cgn/kvcached.sock")
  })

  it("dev.toml runs the simulator as vLLM, standalone, on loopback", () => {
    const c = load("dev.toml")
    const argv = engineFor(c.engine.kind).render(c).argv
    // `node` is the agent's own Node (24), not the first `node` on PATH (an older system Node cannot run .ts)
    expect(argv.slice(0, 6)).toEqual([
      process.execPath,
      "src/programs/sim.ts",
      "--flavor",
      "vllm",
      "serve",
      c.model.source.value
    ])
    expect([c.cluster.etcd, c.agent.listen_grpc, c.agent.state_dir]).toEqual([[], "127.0.0.1:7071", ".cgn-agent/state"])
  })

  it.each([
    ["vllm-prefill.toml", "vllm-decode.toml"],
    ["sglang-prefill.toml", "sglang-decode.toml"]
  ])("%s and %s are a pair: same model and backend, distinct ports", (p, d) => {
    const [a, b] = [load(p), load(d)]
    expect([a.agent.role, b.agent.role]).toEqual(["prefill", "decode"])
    expect(a.model.source).toEqual(b.model.source)
    expect(a.engine.kv_offload).toBe(b.engine.kv_offload)
    expect(a.agent.listen_grpc).not.toBe(b.agent.listen_grpc)
    expect(a.engine.url).not.toBe(b.engine.url)
  })
})
