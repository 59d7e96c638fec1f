// The cgn-agent binary as a subprocess: `check` and `render` exit codes (0 ok, 2 bad config or no config,
// 1 usage errors), the key path of a problem on stderr, `render --json` output, `--help`, `help` and
// `version`, one-line usage errors, `generate`'s address and number checks, the Node version check, the simulator's
// --help/--version, and a real install of the packed package (`cgn-agent` on PATH).
import { type ChildProcess, execFile, execFileSync, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as http2 from "node:http2"
import type { AddressInfo } from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { promisify } from "node:util"
import { Cause, Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerateResponse } from "../../src/gen/cgn/agent/v1/agent.ts"
import { FatalLogged, fatalMessage, logFatal } from "../../src/programs/fatal.ts"
import { nodeTooOld } from "../../src/programs/nodeVersion.ts"
import { ConfigError } from "../../src/services/config/Config.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { VERSION } from "../../src/version.ts"
import { agentEntry, requireDist, simDistEntry } from "../support/agent.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { runCli } from "../support/cli.ts"
import { engineBinEnv } from "../support/engineBin.ts"
import { cliEntry } from "../support/entries.ts"
import { freePort } from "../support/ports.ts"

const ROOT = path.join(import.meta.dirname, "..", "..")
const run = promisify(execFile)

const cli = runCli

let dir = ""
let broken = ""
let pki: TestPki
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-cli-"))
  broken = path.join(dir, "broken.toml")
  await fs.writeFile(broken, '[agent]\nheartbeat = "soon"\n[models.m]\nhf_repo = "a/b"\n')
  pki = makeTestPki()
})
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true })
  pki?.cleanup()
})

/** A config file in the temp dir; `body` goes before a minimal [models.m]. */
const configFile = async (name: string, body: string): Promise<string> => {
  const file = path.join(dir, name)
  await fs.writeFile(file, `${body}\n[models.m]\nhf_repo = "a/b"\n`)
  return file
}

describe("cgn-agent CLI", () => {
  it("check on a valid file: exit 0 and a summary (--offline: without the host's TLS files)", async () => {
    const r = await cli(["check", "--offline", "--config", "examples/prod.toml"])
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
    // prod.toml sets no advertise_addr: the side channel's host is the host the node advertises, here $NODE_IP
    const r = await cli(["render", "--config", "examples/prod.toml"], { NODE_IP: "10.0.12.7" })
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
      '[engine]\nkind = "sglang"\napi_key = "sk-secret"\nenv = { HF_TOKEN = "hf_secret" }\nargs = ["--hf-token", "hf-secret"]\n[models.m]\nhf_repo = "a/b"\n'
    )
    const r = await cli(["render", "--config", file, "--json"])
    expect(r.code).toBe(0)
    const plan = JSON.parse(r.stdout)
    expect(plan.kind).toBe("sglang")
    expect(plan.env).toEqual({ HF_TOKEN: "<redacted>" })
    // engine.api_key: SGLang's flag last, after engine.args; the header the agent sends
    expect(plan.argv.slice(-4)).toEqual(["--hf-token", "<redacted>", "--api-key", "<redacted>"])
    expect(plan.authorization).toBe("Bearer <redacted>")
    expect(r.stdout).not.toContain("secret")
  })

  it("run with agent.state_dir on a kernel filesystem: exit 2 naming the key, as check does (it was a fatal line, exit 1)", async () => {
    const file = path.join(dir, "procstate.toml")
    await fs.writeFile(file, '[agent]\nstate_dir = "/proc/cgn-agent-test"\n[models.m]\nhf_repo = "a/b"\n')
    const r = await cli(["run", "--config", file])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('agent.state_dir = "/proc/cgn-agent-test": /proc is on procfs (a kernel filesystem)')
  })

  it("run with agent.state_dir behind a symbolic link to a missing target: exit 2 naming the key (it was exit 1)", async () => {
    const link = path.join(dir, "dangling-state")
    await fs.symlink(path.join(dir, "no-such-target"), link)
    const file = path.join(dir, "dangling.toml")
    await fs.writeFile(file, `[agent]\nstate_dir = "${link}/state"\n[models.m]\nhf_repo = "a/b"\n`)
    const r = await cli(["run", "--config", file])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain(`agent.state_dir = "${link}/state": ${link} is a symbolic link to a missing target`)
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
    // each flag's line says what the README says of it: all --offline skips, --addr's default
    const check = await cli(["check", "--help"])
    expect(check.stdout).toMatch(
      /--offline +Skip the host's checks: TLS files, GPUs, engine executable, model path, agent\.state_dir \(no KVBM tier only warns\)\n/
    )
    const generate = await cli(["generate", "--help"])
    expect(generate.stdout).toMatch(/--addr HOST:PORT +The agent's gRPC address \(default 127\.0\.0\.1:7071\)\n/)
  })

  it("an unknown flag is a usage error: exit 1, one line, no help text", async () => {
    const r = await cli(["check", "--bogus"])
    expect(r.code).toBe(1)
    expect(r.stderr).toContain("--bogus")
    expect(r.stderr.trim().split("\n")).toHaveLength(1)
    expect(r.stdout).toBe("")
  })

  it("an unknown subcommand is a usage error also with --help and after `help`: exit 1, one line", async () => {
    for (const args of [["frob"], ["frob", "--help"], ["help", "frob"]]) {
      const r = await cli(args)
      expect({ args, code: r.code, stdout: r.stdout, stderr: r.stderr.trim().split("\n") }).toEqual({
        args,
        code: 1,
        stdout: "",
        stderr: ['cgn-agent: Unknown subcommand "frob" for "cgn-agent" (see cgn-agent --help)']
      })
    }
  })

  it("a mistyped subcommand or flag: one line still, with effect/cli's suggestion on it", async () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["chek"], 'cgn-agent: Unknown subcommand "chek" for "cgn-agent"; did you mean check? (see cgn-agent --help)'],
      [
        ["help", "chek"],
        'cgn-agent: Unknown subcommand "chek" for "cgn-agent"; did you mean check? (see cgn-agent --help)'
      ],
      [
        ["check", "--ofline", "--config", "x"],
        "cgn-agent check: Unrecognized flag: --ofline in command cgn-agent check; did you mean --offline? (see cgn-agent check --help)"
      ]
    ]
    for (const [args, line] of cases) {
      const r = await cli(args)
      expect({ args, code: r.code, stdout: r.stdout, stderr: r.stderr }).toEqual({
        args,
        code: 1,
        stdout: "",
        stderr: `${line}\n`
      })
    }
  })

  it("an empty --config (an unset variable in --config=$VAR): exit 2 saying so, not ENOENT on ''", async () => {
    for (const args of [["check", "--config="], ["render", "--config", ""], ["--config="]]) {
      const r = await cli(args, { CGN_AGENT_CONFIG: "examples/dev.toml" })
      expect(r.code).toBe(2)
      expect(r.stderr).toContain("--config: the path is empty; pass --config PATH")
      expect(r.stderr).not.toContain("ENOENT")
    }
  })

  it("a bad CGN_LOG_LEVEL: exit 2 naming the variable (it was passed over silently)", async () => {
    const r = await cli(["check", "--offline", "--config", "examples/dev.toml"], { CGN_LOG_LEVEL: "verbose" })
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('CGN_LOG_LEVEL: expected "trace", "debug", "info", "warn", "error"')
    expect(r.stderr).not.toMatch(/\n\s+at /)
  })

  it("`help` and `version` subcommands print what --help and --version print", async () => {
    const help = await cli(["help", "render"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("cgn-agent render [flags]")
    expect(help.stdout).toContain("--json")
    const root = await cli(["help"])
    expect(root.code).toBe(0)
    expect(root.stdout).toMatch(/SUBCOMMANDS[\s\S]*help[\s\S]*version/)
    const version = await cli(["version"])
    expect(version).toMatchObject({ code: 0, stdout: `cgn-agent v${VERSION}\n` })
    const pkg = JSON.parse(await fs.readFile(path.join(ROOT, "package.json"), "utf8"))
    expect(VERSION).toBe(pkg.version)
  })
})

describe("check makes every check run makes (exit 2); render the config's own", () => {
  it("admin off loopback without a token", async () => {
    const file = await configFile(
      "open-admin.toml",
      `[agent]\nlisten_admin = "0.0.0.0:9091"\nstate_dir = "${dir}/open-admin-state"`
    )
    const r = await cli(["check", "--config", file])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain(`invalid config ${file}:`)
    expect(r.stderr).toContain('agent.listen_admin = "0.0.0.0:9091" is not a loopback address')
    // the token from the environment (a Kubernetes Secret) satisfies it, as it does for run (vllm on PATH)
    const ok = await cli(["check", "--config", file], { CGN_AGENT_ADMIN_TOKEN: "t", ...engineBinEnv(dir) })
    expect(ok.code).toBe(0)
    // render prints what run would start, and run starts nothing for it: refused the same way
    const rendered = await cli(["render", "--config", file])
    expect([rendered.code, rendered.stdout]).toEqual([2, ""])
    expect(rendered.stderr).toContain('agent.listen_admin = "0.0.0.0:9091" is not a loopback address')
    expect((await cli(["render", "--config", file], { CGN_AGENT_ADMIN_TOKEN: "t" })).code).toBe(0)
  })

  it("TLS files that do not exist, each reported, for the gRPC server and for etcd; --offline skips them", async () => {
    const missing = path.join(dir, "nope")
    const file = await configFile(
      "missing-tls.toml",
      [
        "[cluster]",
        'etcd = ["https://127.0.0.1:2379"]',
        `etcd_ca_file = "${missing}/ca.crt"`,
        "[security]",
        "require_mtls = true",
        `ca_file = "${missing}/ca.crt"`,
        `cert_file = "${missing}/tls.crt"`,
        `key_file = "${missing}/tls.key"`
      ].join("\n")
    )
    const r = await cli(["check", "--config", file])
    expect(r.code).toBe(2)
    // Every unreadable file, each on its own line.
    expect(r.stderr).toContain(`security.ca_file (${missing}/ca.crt): cannot read: ENOENT`)
    expect(r.stderr).toContain(`security.cert_file (${missing}/tls.crt): cannot read: ENOENT`)
    expect(r.stderr).toContain(`security.key_file (${missing}/tls.key): cannot read: ENOENT`)
    expect(r.stderr).toContain(`cluster.etcd_ca_file: cannot read ${missing}/ca.crt: ENOENT`)
    expect((await cli(["check", "--offline", "--config", file])).code).toBe(0)
  })

  it("a file that is not UTF-8: exit 2 with the file, line and column, no stack trace", async () => {
    const file = path.join(dir, "latin1.toml")
    await fs.writeFile(file, Buffer.concat([Buffer.from('[agent]\nnode_id = "caf'), Buffer.from([0xe9, 0x22, 0x0a])]))
    const r = await cli(["check", "--config", file])
    expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 2, stdout: "" })
    expect(r.stderr.trim()).toBe(
      `invalid config ${file}:\n  line 2, column 15: invalid UTF-8 (byte 0xe9 at offset 22); save the file as UTF-8`
    )
  })

  it("credentials in engine.url or an etcd URL: exit 2, and the password is printed nowhere", async () => {
    const file = await configFile(
      "url-credentials.toml",
      '[cluster]\netcd = ["http://root:s3cret@127.0.0.1:2379"]\n[engine]\nurl = "http://admin:s3cret@127.0.0.1:8000"'
    )
    const r = await cli(["check", "--offline", "--config", file])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain("cluster.etcd[0]: credentials do not belong in the URL; set cluster.etcd_username")
    expect(r.stderr).toContain("engine.url: credentials do not belong in the URL;")
    expect(`${r.stdout}${r.stderr}`).not.toContain("s3cret")
  })

  it("TLS files that are no PEM: every one on its own line, for the gRPC server and for etcd (the first alone before)", async () => {
    const junk = path.join(dir, "junk.pem")
    await fs.writeFile(junk, "not pem\n")
    const file = await configFile(
      "junk-tls.toml",
      [
        "[cluster]",
        'etcd = ["https://127.0.0.1:2379"]',
        `etcd_ca_file = "${pki.ca.certFile}"`,
        `etcd_cert_file = "${junk}"`,
        `etcd_key_file = "${junk}"`,
        "[security]",
        "require_mtls = true",
        `ca_file = "${junk}"`,
        `cert_file = "${junk}"`,
        `key_file = "${junk}"`
      ].join("\n")
    )
    const r = await cli(["check", "--config", file])
    expect(r.code).toBe(2)
    const lines = r.stderr.split("\n").map((l) => l.trim())
    const lineOf = (key: string) => lines.find((l) => l.startsWith(`${key} (${junk}): not a PEM`))
    for (const key of ["security.ca_file", "security.cert_file", "security.key_file"])
      expect(lineOf(key), r.stderr).toBeDefined()
    expect(lineOf("security.key_file")).toContain("not a PEM private key")
    for (const key of ["cluster.etcd_cert_file", "cluster.etcd_key_file"]) expect(lineOf(key), r.stderr).toBeDefined()
    // a good file says nothing
    expect(r.stderr).not.toContain("cluster.etcd_ca_file")
  })

  it("a key that does not belong to the certificate, for the gRPC server and for etcd; run refuses the same file with the same exit code", async () => {
    const file = await configFile(
      "mismatch.toml",
      [
        "[cluster]",
        'etcd = ["https://127.0.0.1:2379"]',
        `etcd_ca_file = "${pki.ca.certFile}"`,
        `etcd_cert_file = "${pki.client.certFile}"`,
        `etcd_key_file = "${pki.server.keyFile}"`,
        "[security]",
        "require_mtls = true",
        `ca_file = "${pki.ca.certFile}"`,
        `cert_file = "${pki.server.certFile}"`,
        `key_file = "${pki.client.keyFile}"`,
        "[agent]",
        `state_dir = "${dir}/state"`,
        'listen_grpc = "127.0.0.1:0"',
        'listen_admin = "127.0.0.1:0"',
        "[engine]",
        'command = ["/bin/false"]'
      ].join("\n")
    )
    const checked = await cli(["check", "--config", file])
    expect(checked.code).toBe(2)
    const mismatches = (stderr: string) =>
      stderr
        .split("\n")
        .filter((l) => l.includes("does not belong to the certificate"))
        .map((l) => l.trim().split(/[ :]/)[0])
    expect(mismatches(checked.stderr), checked.stderr).toEqual(["security.key_file", "cluster.etcd_key_file"])
    // run stops at the same check, before it starts anything (no engine, no listener, no etcd client)
    const ran = await cli(["run", "--config", file])
    expect(ran.code).toBe(2)
    expect(mismatches(ran.stderr), ran.stderr).toEqual(["security.key_file", "cluster.etcd_key_file"])
    expect(ran.stderr).not.toContain("listening")
  })
})

describe("run's fatal errors", () => {
  it("a ConfigError found once logging started (the GPUs NVML lists at start) keeps exit 2, its problems on one line", async () => {
    const e = new ConfigError({ file: "f.toml", problems: ['models."m".gpus: a GPU it lacks', "second"] })
    expect(fatalMessage(e)).toBe('invalid config f.toml: models."m".gpus: a GPU it lacks; second')
    // "None": the line is not written here
    const exit = await Effect.runPromiseExit(Effect.fail(e).pipe(logFatal("info", "None")))
    expect(Exit.isFailure(exit) && Cause.squash(exit.cause)).toEqual(new FatalLogged({ exitCode: 2 }))
    const other = await Effect.runPromiseExit(Effect.fail(new Error("x")).pipe(logFatal("info", "None")))
    expect(Exit.isFailure(other) && Cause.squash(other.cause)).toEqual(new FatalLogged({ exitCode: 1 }))
  })

  it("an error after logging started is the last JSON log line (level fatal, the key and the reason), exit 1", async () => {
    // the admin port held by someone else: the daemon has logged its start, then cannot listen
    const holder = http2.createServer()
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve))
    const port = (holder.address() as AddressInfo).port
    try {
      const file = await configFile(
        "admin-in-use.toml",
        [
          "[agent]",
          `state_dir = "${dir}/fatal-state"`,
          'listen_grpc = "127.0.0.1:0"',
          `listen_admin = "127.0.0.1:${port}"`,
          "[engine]",
          'kind = "openai_compat"',
          'url = "http://127.0.0.1:9"'
        ].join("\n")
      )
      const r = await cli(["run", "--config", file])
      expect(r.code, r.stderr).toBe(1)
      const lines = r.stderr.trim().split("\n")
      // every line of stderr is one JSON object: no plain `cgn-agent: ...` line after the log
      const records = lines.map((l) => JSON.parse(l) as Record<string, unknown>)
      expect(records.length).toBeGreaterThan(1)
      expect(records.at(-1)).toMatchObject({
        level: "fatal",
        msg: expect.stringMatching(new RegExp(`^agent\\.listen_admin = "127\\.0\\.0\\.1:${port}": .*EADDRINUSE`)),
        exit_code: 1
      })
      expect(Object.keys(records.at(-1) ?? {}).slice(0, 3)).toEqual(["ts", "level", "msg"])
    } finally {
      await new Promise<void>((resolve) => holder.close(() => resolve()))
    }
  })
})

describe("generate's arguments", () => {
  it("--max-tokens abc: one line, not the whole help", async () => {
    const r = await cli(["generate", "--max-tokens", "abc", "--prompt", "hi"])
    expect(r.code).toBe(1)
    expect(r.stderr.trim().split("\n")).toEqual([expect.stringContaining('--max-tokens: "abc"')])
    expect(r.stdout).toBe("")
  })

  it("numbers out of range are refused before anything is sent: one line each, no stack trace", async () => {
    const cases: ReadonlyArray<[ReadonlyArray<string>, string]> = [
      // AbortSignal.timeout threw a RangeError with a stack trace
      [
        ["--timeout", "-5"],
        'Invalid value for flag --timeout: "-5". Expected: a whole number of seconds from 1 to 2147483'
      ],
      [
        ["--timeout", "0"],
        'Invalid value for flag --timeout: "0". Expected: a whole number of seconds from 1 to 2147483'
      ],
      // a Node timer takes at most 2^31 - 1 ms: a longer one fired after 1 ms, the call ended DEADLINE_EXCEEDED at once
      [
        ["--timeout", "2147484"],
        'Invalid value for flag --timeout: "2147484". Expected: a whole number of seconds from 1 to 2147483'
      ],
      // max_tokens is a uint32: the call failed with "INTERNAL: Request message serialization failure"
      [
        ["--max-tokens", "-1"],
        'Invalid value for flag --max-tokens: "-1". Expected: a number of tokens from 1 to 4294967295'
      ],
      [
        ["--max-tokens", "99999999999"],
        'Invalid value for flag --max-tokens: "99999999999". Expected: a number of tokens from 1 to 4294967295'
      ]
    ]
    const port = await freePort()
    const runs = await Promise.all(
      cases.map(([flags]) => cli(["generate", "--addr", `127.0.0.1:${port}`, "--prompt", "hi", ...flags]))
    )
    for (const [i, r] of runs.entries()) {
      expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 1, stdout: "" })
      expect(r.stderr.trim().split("\n")).toEqual([
        `cgn-agent generate: ${cases[i]![1]} (see cgn-agent generate --help)`
      ])
    }
  })

  it("--addr without a port is refused before dialing (grpc-js would dial port 80)", async () => {
    const r = await cli(["generate", "--addr", "127.0.0.1", "--prompt", "hi"])
    expect(r.code).toBe(1)
    expect(r.stderr.trim()).toBe('cgn-agent: --addr "127.0.0.1": expected HOST:PORT, e.g. --addr 127.0.0.1:7071')
  })

  it("--addr with port 0 is refused before dialing (the connect failure named no port)", async () => {
    const r = await cli(["generate", "--addr", "127.0.0.1:0", "--prompt", "hi"])
    expect([r.code, r.stderr.trim()]).toEqual([
      1,
      'cgn-agent: --addr "127.0.0.1:0": port 0 is no port to dial; give the agent\'s gRPC port'
    ])
  })

  it("a refused connection is one short line", async () => {
    // A port just found free: nothing listens there (a fixed low port may be taken on some machine).
    const port = await freePort()
    const r = await cli(["generate", "--addr", `127.0.0.1:${port}`, "--prompt", "hi", "--timeout", "5"])
    expect(r.code).toBe(1)
    expect(r.stderr.trim()).toBe(`cgn-agent: UNAVAILABLE: cannot connect: connect ECONNREFUSED 127.0.0.1:${port}`)
  })

  // README: "--prompt TEXT or one or more --message ROLE:TEXT"
  it("--prompt with --message, and a --message without a role, are refused before dialing", async () => {
    const addr = `127.0.0.1:${await freePort()}`
    const both = await cli(["generate", "--addr", addr, "--prompt", "hi", "--message", "user:hi"])
    expect([both.code, both.stderr.trim()]).toEqual([
      1,
      "cgn-agent: give either --prompt TEXT or one or more --message ROLE:TEXT"
    ])
    const noRole = await cli(["generate", "--addr", addr, "--message", ":hi"])
    expect([noRole.code, noRole.stderr.trim()]).toEqual([
      1,
      'cgn-agent: --message ":hi": expected ROLE:TEXT, e.g. --message "user:Hello"'
    ])
  })

  it("an agent that does not answer within --timeout: DEADLINE_EXCEEDED naming the flag, exit 1; the agent was told the deadline (grpc-timeout)", async () => {
    // a stand-in agent that takes the call and never answers
    const timeouts: Array<string | undefined> = []
    const server = http2.createServer((req, res) => {
      timeouts.push(req.headers["grpc-timeout"] as string | undefined)
      req.resume()
      res.writeHead(200, { "content-type": "application/grpc" })
    })
    const sessions: Array<http2.ServerHttp2Session> = []
    server.on("session", (session) => sessions.push(session))
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    try {
      const port = (server.address() as AddressInfo).port
      const r = await cli(["generate", "--addr", `127.0.0.1:${port}`, "--prompt", "hi", "--timeout", "1"])
      expect([r.code, r.stderr]).toEqual([
        1,
        "cgn-agent: DEADLINE_EXCEEDED: no complete answer within 1s (--timeout)\n"
      ])
      // without it the agent can neither shed the call by its deadline nor count its end as DEADLINE_EXCEEDED
      expect(timeouts).toEqual(["1000m"])
    } finally {
      for (const session of sessions) session.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
  })
})

describe("generate into a closed pipe", () => {
  /** `p`, or a failure naming `what` after `ms`: a CLI that never writes or never exits fails the test, bounded. */
  const within = <A>(p: Promise<A>, ms: number, what: string): Promise<A> => {
    let timer: ReturnType<typeof setTimeout> | undefined
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms)
    })
    return Promise.race([p, late]).finally(() => clearTimeout(timer))
  }

  it("`generate | head`: the reader leaving cancels the call and the CLI ends quietly, exit 0", async () => {
    // A stand-in agent that streams a delta every 5 ms until the caller goes.
    let cancelled!: () => void
    const callerLeft = new Promise<void>((resolve) => {
      cancelled = resolve
    })
    const server = http2.createServer((req, res) => {
      req.resume()
      res.writeHead(200, { "content-type": "application/grpc" })
      const delta = frameMessage(
        Buffer.from(GenerateResponse.encode({ delta: { text: "tok ", tokens: 1, index: 0 } }).finish())
      )
      const timer = setInterval(() => res.write(delta), 5)
      res.on("close", () => {
        clearInterval(timer)
        cancelled()
      })
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    let child: ChildProcess | undefined
    let exited: Promise<number | null> | undefined
    try {
      const port = (server.address() as AddressInfo).port
      const cli = spawn(process.execPath, [cliEntry(), "generate", "--addr", `127.0.0.1:${port}`, "--prompt", "hi"], {
        cwd: ROOT,
        stdio: ["ignore", "pipe", "pipe"]
      })
      child = cli
      let stderr = ""
      cli.stderr.on("data", (c: Buffer) => {
        stderr += c.toString()
      })
      exited = new Promise<number | null>((resolve) => cli.once("exit", (code) => resolve(code)))
      // the first text arrives, then the reader goes (as `head -c` does)
      await within(new Promise<void>((resolve) => cli.stdout.once("data", () => resolve())), 30_000, "the first text")
      cli.stdout.destroy()
      expect(await within(exited, 15_000, "the CLI's exit")).toBe(0)
      // the stand-in agent saw the call end: not left streaming
      await within(callerLeft, 5_000, "the stand-in agent to see the call end")
      expect(stderr).not.toContain("Unhandled 'error' event")
      expect(stderr).toContain("stdout closed by its reader: call cancelled")
    } finally {
      // a CLI that never wrote, or never exited, is not left running past the test
      if (child !== undefined && child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL")
        await exited
      }
      server.close()
    }
  })

  it("Ctrl-C (SIGINT) mid-stream: the call is cancelled, the text's line ended and the summary said, exit 130", async () => {
    // A stand-in agent that streams a delta every 5 ms until the caller goes.
    let cancelled!: () => void
    const callerLeft = new Promise<void>((resolve) => {
      cancelled = resolve
    })
    const server = http2.createServer((req, res) => {
      req.resume()
      res.writeHead(200, { "content-type": "application/grpc" })
      const delta = frameMessage(
        Buffer.from(GenerateResponse.encode({ delta: { text: "tok", tokens: 1, index: 0 } }).finish())
      )
      const timer = setInterval(() => res.write(delta), 5)
      res.on("close", () => {
        clearInterval(timer)
        cancelled()
      })
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    let child: ChildProcess | undefined
    let exited: Promise<number | null> | undefined
    try {
      const port = (server.address() as AddressInfo).port
      const cli = spawn(process.execPath, [cliEntry(), "generate", "--addr", `127.0.0.1:${port}`, "--prompt", "hi"], {
        cwd: ROOT,
        stdio: ["ignore", "pipe", "pipe"]
      })
      child = cli
      let [stdout, stderr] = ["", ""]
      cli.stdout.on("data", (c: Buffer) => {
        stdout += c.toString()
      })
      cli.stderr.on("data", (c: Buffer) => {
        stderr += c.toString()
      })
      exited = new Promise<number | null>((resolve) => cli.once("exit", (code) => resolve(code)))
      await within(new Promise<void>((resolve) => cli.stdout.once("data", () => resolve())), 30_000, "the first text")
      cli.kill("SIGINT")
      expect(await within(exited, 15_000, "the CLI's exit")).toBe(130)
      await within(callerLeft, 5_000, "the stand-in agent to see the call end")
      // the prompt starts on a line of its own, and the summary says what the call came to
      expect(stdout).toMatch(/^(tok)+\n$/)
      expect(stderr).toMatch(/^\d+ tokens \(engine chunks\), time to first token .* \(interrupted: call cancelled\)\n$/)
    } finally {
      if (child !== undefined && child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL")
        await exited
      }
      server.close()
    }
  })
})

describe("the built binaries", () => {
  beforeAll(() => requireDist())

  /** A Node older than 24 on this machine (the system's, e.g. Debian's v20), if there is one. */
  const oldNode = (() => {
    for (const candidate of ["/usr/bin/node", "/usr/local/bin/node"]) {
      try {
        const v = execFileSync(candidate, ["--version"], { encoding: "utf8" }).trim()
        if (Number(v.slice(1).split(".")[0]) < 24) return candidate
      } catch {
        // not there
      }
    }
    return undefined
  })()

  it("the version check names what is needed", () => {
    expect(nodeTooOld("24.0.0", "/x/node")).toBeUndefined()
    expect(nodeTooOld("25.1.0", "/x/node")).toBeUndefined()
    expect(nodeTooOld("20.20.2", "/usr/bin/node")).toBe(
      "cgn-agent needs Node.js 24 or newer; this is Node.js 20.20.2 (/usr/bin/node). " +
        "Install Node 24 (https://nodejs.org, or nvm install 24) and run it with that node."
    )
  })

  it.runIf(oldNode !== undefined)("dist/main.js on an older Node says it needs Node 24, exit 1", async () => {
    const r = await run(oldNode!, [agentEntry, "--version"]).then(
      () => ({ code: 0, stderr: "" }),
      (e: { code: number; stderr: string }) => e
    )
    expect(r.code).toBe(1)
    expect(r.stderr.trim()).toMatch(/^cgn-agent needs Node\.js 24 or newer; this is Node\.js 2\d\.\d+\.\d+ /)
  })

  it("cgn-engine-sim --help and --version print and exit (they start no server)", async () => {
    const help = await run(process.execPath, [simDistEntry, "--help"], { timeout: 10_000 })
    expect(help.stdout).toContain("Usage: cgn-engine-sim")
    expect(help.stdout).toContain("--sim-ttft")
    expect(help.stderr).not.toContain("listening")
    const version = await run(process.execPath, [simDistEntry, "--version"], { timeout: 10_000 })
    expect(version.stdout).toBe(`${VERSION}\n`)
  })

  it("the packed package holds both binaries; a global install puts cgn-agent and cgn-engine-sim on PATH", async () => {
    const npm = (args: ReadonlyArray<string>, cwd = ROOT) =>
      run("npm", [...args], { cwd, env: { ...process.env, npm_config_loglevel: "error" }, timeout: 240_000 })
    // What `npm publish` would ship (`files` in package.json): the built binaries, the protos, the examples.
    const packed = await npm(["pack", "--dry-run", "--ignore-scripts", "--json"])
    const files = (JSON.parse(packed.stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path)
    expect(files).toEqual(
      expect.arrayContaining([
        "dist/main.js",
        "dist/programs/sim.js",
        "proto/cgn/agent/v1/agent.proto",
        "examples/dev.toml"
      ])
    )
    // From a clone (README "Install"): `npm install --global .` links the checkout, its node_modules and bins.
    const prefix = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-install-"))
    try {
      await npm([
        "install",
        "--global",
        "--prefix",
        prefix,
        "--offline",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        ROOT
      ])
      const env = {
        ...process.env,
        PATH: `${path.join(prefix, "bin")}:${path.dirname(process.execPath)}:/usr/bin:/bin`
      }
      const agent = await run("cgn-agent", ["--version"], { env, cwd: os.tmpdir() })
      expect(agent.stdout).toBe(`cgn-agent v${VERSION}\n`)
      const checked = await run(
        "cgn-agent",
        ["check", "--offline", "--config", path.join(ROOT, "examples/prod.toml")],
        {
          env,
          cwd: os.tmpdir()
        }
      )
      expect(checked.stdout).toContain("ok")
      const sim = await run("cgn-engine-sim", ["--version"], { env })
      expect(sim.stdout).toBe(`${VERSION}\n`)
    } finally {
      await fs.rm(prefix, { recursive: true, force: true })
    }
  }, 300_000)
})
