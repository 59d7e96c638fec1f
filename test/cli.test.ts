// The cgn-agent binary as a subprocess: `check` and `render` exit codes (0 ok, 2 bad config or no config,
// 1 usage errors), the key path of a problem on stderr, `render --json` output, and `--help`.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { runCli } from "./support/cli.ts"

const ROOT = path.join(import.meta.dirname, "..")
const _MAIN = path.join(ROOT, "src", "main.ts")

const cli = runCli

let dir = ""
let broken = ""
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-cli-"))
  broken = path.join(dir, "broken.toml")
  await fs.writeFile(broken, '[agent]\nheartbeat = "soon"\n[models.m]\nhf_repo = "a/b"\n')
})
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true })
})

describe("cgn-agent CLI", () => {
  it("check on a valid file: exit 0 and a summary", async () => {
    const r = await cli(["check", "--config", "examples/prod.toml"])
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("examples/prod.toml: ok")
    expect(r.stdout).toMatch(/engine: +vllm/)
    expect(r.stdout).toMatch(/tp: +4/)
    expect(r.stdout).toMatch(/kv_offload: +nixl/)
    expect(r.stdout).toContain("etcd https://etcd-0.cgn.internal:2379")
  })

  it("check on a broken file: exit 2, the key path on stderr", async () => {
    const r = await cli(["check", "--config", broken])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain(`invalid config ${broken}:`)
    expect(r.stderr).toContain('agent.heartbeat: expected a duration such as "500ms", "5s", "2m" or "1h", got "soon"')
    expect(r.stdout).toBe("")
  })

  it("no --config and no CGN_AGENT_CONFIG: exit 2 saying how to give one", async () => {
    const r = await cli(["check"])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain("--config: no config file given; pass --config PATH or set CGN_AGENT_CONFIG")
  })

  it("CGN_AGENT_CONFIG names the file when --config is absent", async () => {
    const r = await cli(["render"], { CGN_AGENT_CONFIG: "examples/llama-cpp.toml" })
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("command:   llama-server -m /models/Llama-3.2-3B-Instruct-Q4_K_M.gguf")
  })

  it("render prints the shell-quoted command line, env and URLs", async () => {
    const r = await cli(["render", "--config", "examples/prod.toml"])
    expect(r.code).toBe(0)
    expect(r.stdout).toContain(
      "command:   vllm serve meta-llama/Meta-Llama-3-70B-Instruct --host 127.0.0.1 --port 8000 --tensor-parallel-size 4"
    )
    expect(r.stdout).toContain(
      `--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail"}'`
    )
    expect(r.stdout).toContain("  VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.12.7\n")
    expect(r.stdout).toContain("probe:     GET http://127.0.0.1:8000/v1/models (200 = ready)")
  })

  it("render --json parses, with secrets redacted", async () => {
    const file = path.join(dir, "secret.toml")
    await fs.writeFile(
      file,
      '[engine]\nenv = { HF_TOKEN = "hf_secret" }\nargs = ["--api-key", "sk-secret"]\n[models.m]\nhf_repo = "a/b"\n'
    )
    const r = await cli(["render", "--config", file, "--json"])
    expect(r.code).toBe(0)
    const plan = JSON.parse(r.stdout)
    expect(plan.kind).toBe("vllm")
    expect(plan.env).toEqual({ HF_TOKEN: "<redacted>" })
    expect(plan.argv.slice(-2)).toEqual(["--api-key", "<redacted>"])
    expect(r.stdout).not.toContain("secret")
  })

  it("check: a llama.cpp served name with a comma exits 2 with the key path and the reason", async () => {
    const file = path.join(dir, "comma.toml")
    await fs.writeFile(file, '[engine]\nkind = "llama_cpp"\n[models.m]\npath = "/m.gguf"\nserved_name = "a,b"\n')
    const r = await cli(["check", "--config", file])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('models."m".served_name: llama_cpp cannot serve the name "a,b"')
    expect(r.stderr).toContain("splits -a on commas")
  })

  it("render on a broken file: exit 2", async () => {
    const r = await cli(["render", "--config", broken, "--json"])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain("agent.heartbeat:")
  })

  it("--help and per-command help: exit 0", async () => {
    const root = await cli(["--help"])
    expect(root.code).toBe(0)
    expect(root.stdout).toContain("check")
    expect(root.stdout).toContain("render")
    const render = await cli(["render", "--help"])
    expect(render.code).toBe(0)
    expect(render.stdout).toContain("--json")
    expect(render.stdout).toContain("--config")
  })

  it("an unknown flag is a usage error: exit 1", async () => {
    const r = await cli(["check", "--bogus"])
    expect(r.code).toBe(1)
    expect(r.stderr).toContain("--bogus")
  })
})
