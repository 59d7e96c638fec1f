// What a config fuzzer found `check` passing and `run` failing on, each refused now with the key and the reason:
// listeners on one address spelled two ways, etcd TLS files [security] would refuse, NUL characters, date-times
// where tables go, etcd settings etcd refuses, ports a DP rank pushes past 65535, floats for integer keys.
import { execFile } from "node:child_process"
import * as crypto from "node:crypto"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Result } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfig, decodeConfigObject } from "../../src/layers/config/Config.ts"
import { preflight } from "../../src/programs/check.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { agentEntry, requireDist } from "../support/agent.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"

const MODEL = '[models.m]\nhf_repo = "a/b"\n'

const problemsOf = (text: string): ReadonlyArray<string> => {
  const r = decodeConfig(text, "f.toml", {})
  return Result.isFailure(r) ? r.failure.problems : []
}

const configOf = (text: string): AgentConfig => {
  const r = decodeConfig(text, "f.toml", { NODE_NAME: "n1" })
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

/** The problems `check` (and `run`, before it starts anything) finds in a decoded config, at `at` (ms). */
const preflightAt = (c: AgentConfig, at: number): Promise<ReadonlyArray<string>> =>
  Effect.runPromise(
    TestClock.setTime(at).pipe(
      Effect.andThen(preflight(c)),
      Effect.as([] as ReadonlyArray<string>),
      Effect.catchTag("ConfigError", (e) => Effect.succeed(e.problems)),
      Effect.provide(TestClock.layer())
    )
  )

describe("listeners: one address in any spelling is one address (no DNS)", () => {
  const overlap = (a: string, b: string, why: string) =>
    `agent.listen_admin: "${b}" overlaps agent.listen_grpc = "${a}" (${why}); the second to bind would fail with EADDRINUSE: give each its own port`
  it.each([
    ["localhost:17000", "127.0.0.1:17000", "same port, and 127.0.0.1 and localhost both name 127.0.0.1"],
    ["localhost:17000", "[::1]:17000", "same port, and [::1] and localhost both name [::1]"],
    [
      "[::ffff:127.0.0.1]:17000",
      "127.0.0.1:17000",
      "same port, and 127.0.0.1 and [::ffff:127.0.0.1] both name 127.0.0.1"
    ],
    ["localhost.:17000", "127.1:17000", "same port, and 127.1 and localhost. both name 127.0.0.1"],
    ["127.1:17000", "127.0.0.1:17000", "same host and port"]
  ])("%s and %s", (grpc, admin, why) => {
    expect(problemsOf(`[agent]\nlisten_grpc = "${grpc}"\nlisten_admin = "${admin}"\n${MODEL}`)).toEqual([
      overlap(grpc, admin, why)
    ])
  })

  it("other addresses, or other ports, do not meet", () => {
    for (const [grpc, admin] of [
      ["localhost:17000", "10.0.0.1:17000"],
      ["[::ffff:10.0.0.1]:17000", "127.0.0.1:17000"],
      ["localhost:17000", "127.0.0.1:17001"]
    ])
      expect(problemsOf(`[agent]\nlisten_grpc = "${grpc}"\nlisten_admin = "${admin}"\n${MODEL}`)).toEqual([])
  })

  it("a spawned engine on localhost meets the admin listener on 127.0.0.1 (the default 9091)", () => {
    expect(problemsOf(`[engine]\nurl = "http://localhost:9091"\n${MODEL}`)).toEqual([
      'engine.url: vllm is spawned by the agent on port 9091, which overlaps agent.listen_admin = "127.0.0.1:9091" (same port, and localhost and 127.0.0.1 both name 127.0.0.1); the engine would fail with EADDRINUSE and be restarted again and again: give it another port'
    ])
  })

  it("admin_token: the whitespace around it trimmed (a Secret made from a file ends with a newline); inside it, refused", () => {
    const tokenOf = (text: string, env: Record<string, string> = {}) => {
      const r = decodeConfig(text, undefined, env)
      return Result.isSuccess(r) ? r.success.agent.admin_token : r.failure.problems
    }
    expect(tokenOf(MODEL, { CGN_AGENT_ADMIN_TOKEN: "s3cret\n" })).toBe("s3cret")
    expect(tokenOf(`[agent]\nadmin_token = " s3cret\\n"\n${MODEL}`)).toBe("s3cret")
    expect(tokenOf(MODEL, { CGN_AGENT_ADMIN_TOKEN: "a b" })).toEqual([
      "CGN_AGENT_ADMIN_TOKEN: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)"
    ])
    expect(tokenOf(`[agent]\nadmin_token = "\\t"\n${MODEL}`)).toEqual([
      "agent.admin_token: only whitespace; set a token or remove it"
    ])
  })

  it("listen_admin on 127.1, localhost. or [::ffff:127.0.0.1] is loopback: no admin_token needed", async () => {
    for (const admin of ["127.1:9091", "localhost.:9091", "[::ffff:127.0.0.1]:9091", "[0:0::1]:9091"]) {
      const c = configOf(`[agent]\nlisten_admin = "${admin}"\n${MODEL}`)
      expect(await preflightAt(c, Date.now()), admin).toEqual([])
    }
    const open = configOf(`[agent]\nlisten_admin = "[::ffff:10.0.0.1]:9091"\n${MODEL}`)
    expect((await preflightAt(open, Date.now()))[0]).toContain("is not a loopback address")
  })
})

describe("[cluster] etcd TLS files are checked as [security]'s are", () => {
  let pki: TestPki
  beforeAll(() => {
    pki = makeTestPki()
  })
  afterAll(() => pki.cleanup())

  const etcdConfig = (files: { ca?: string; cert: string; key: string }) =>
    configOf(
      [
        "[cluster]",
        'etcd = ["https://127.0.0.1:2379"]',
        ...(files.ca === undefined ? [] : [`etcd_ca_file = "${files.ca}"`]),
        `etcd_cert_file = "${files.cert}"`,
        `etcd_key_file = "${files.key}"`,
        MODEL
      ].join("\n")
    )
  const client = () => new crypto.X509Certificate(pki.client.cert)

  it("a valid client pair passes", async () => {
    const c = etcdConfig({ ca: pki.ca.certFile, cert: pki.client.certFile, key: pki.client.keyFile })
    expect(await preflightAt(c, Date.now())).toEqual([])
  })

  it("an expired or not yet valid client certificate is refused, naming cluster.etcd_cert_file", async () => {
    // no CA (the system roots): the client certificate is the first file checked
    const c = etcdConfig({ cert: pki.client.certFile, key: pki.client.keyFile })
    expect(await preflightAt(c, Date.parse(client().validTo) + 1000)).toEqual([
      `cluster.etcd_cert_file (${pki.client.certFile}): certificate expired on ${client().validTo}`
    ])
    expect(await preflightAt(c, Date.parse(client().validFrom) - 3_600_000)).toEqual([
      `cluster.etcd_cert_file (${pki.client.certFile}): certificate not valid before ${client().validFrom}`
    ])
  })

  it("an expired CA is refused, naming cluster.etcd_ca_file; the client certificate it outlived on a line of its own", async () => {
    const c = etcdConfig({ ca: pki.ca.certFile, cert: pki.client.certFile, key: pki.client.keyFile })
    const ca = new crypto.X509Certificate(pki.ca.cert)
    // a second past both: the client's may end a second after the CA's, when making them crossed a second (CI)
    const after = Math.max(Date.parse(ca.validTo), Date.parse(client().validTo)) + 1000
    expect(await preflightAt(c, after)).toEqual([
      `cluster.etcd_ca_file (${pki.ca.certFile}): certificate expired on ${ca.validTo}`,
      `cluster.etcd_cert_file (${pki.client.certFile}): certificate expired on ${client().validTo}`
    ])
  })

  it("three unreadable files are three lines, as [security]'s are (not the first one alone)", async () => {
    const missing = path.join(os.tmpdir(), "cgn-no-such-dir")
    const c = etcdConfig({ ca: `${missing}/ca.crt`, cert: `${missing}/tls.crt`, key: `${missing}/tls.key` })
    const problems = await preflightAt(c, Date.now())
    expect(problems.map((p) => p.replace(/: ENOENT.*/, ""))).toEqual([
      `cluster.etcd_ca_file: cannot read ${missing}/ca.crt`,
      `cluster.etcd_cert_file: cannot read ${missing}/tls.crt`,
      `cluster.etcd_key_file: cannot read ${missing}/tls.key`
    ])
  })

  it("a key of another certificate is refused, naming cluster.etcd_key_file", async () => {
    const c = etcdConfig({ ca: pki.ca.certFile, cert: pki.client.certFile, key: pki.server.keyFile })
    expect(await preflightAt(c, Date.now())).toEqual([
      `cluster.etcd_key_file (${pki.server.keyFile}): does not belong to the certificate in cluster.etcd_cert_file`
    ])
  })
})

describe("a NUL character in any key or string is refused, printed escaped", () => {
  const why =
    "no file path, argument, host name or environment variable can hold one (the system call given it fails); remove it"
  it.each([
    ["agent.state_dir", `[agent]\nstate_dir = "/tmp/a\\u0000b"\n${MODEL}`, '"/tmp/a\\u0000b"'],
    ["engine.args[1]", `[engine]\nargs = ["--x", "y\\u0000"]\n${MODEL}`, '"y\\u0000"'],
    ["engine.command[0]", `[engine]\ncommand = ["vl\\u0000lm"]\n${MODEL}`, '"vl\\u0000lm"'],
    ["engine.env.A", `[engine]\nenv = { A = "\\u0000" }\n${MODEL}`, '"\\u0000"'],
    ["engine.side_channel_host", `[engine]\nside_channel_host = "h\\u0000"\n${MODEL}`, '"h\\u0000"'],
    ['models."m".served_name', `${MODEL}served_name = "s\\u0000"\n`, '"s\\u0000"'],
    ['models."m".hf_repo', '[models.m]\nhf_repo = "a/b\\u0000"\n', '"a/b\\u0000"']
  ])("%s", (key, text, shown) => {
    expect(problemsOf(text)).toEqual([`${key}: a NUL character (\\u0000) in ${shown}: ${why}`])
  })

  it("in a key (an env name, the model's name), in a long value (an excerpt), from an object; never raw", () => {
    expect(problemsOf(`[engine]\nenv = { "A\\u0000B" = "x" }\n${MODEL}`)).toEqual([
      `engine.env."A\\u0000B": a NUL character (\\u0000) in the key: ${why}`
    ])
    const named = problemsOf('[models."m\\u0000"]\nhf_repo = "a/b"\n')
    expect(named).toEqual([`models."m\\u0000": a NUL character (\\u0000) in the key: ${why}`])
    expect(problemsOf(`[agent]\nstate_dir = "/${"x".repeat(100)}\\u0000"\n${MODEL}`)).toEqual([
      `agent.state_dir: a NUL character (\\u0000) in ..."${"x".repeat(30)}\\u0000": ${why}`
    ])
    const r = decodeConfigObject({ agent: { state_dir: "/a\0" }, models: { m: { hf_repo: "a/b" } } }, undefined, {})
    expect(Result.isFailure(r) && r.failure.problems).toEqual([
      `agent.state_dir: a NUL character (\\u0000) in "/a\\u0000": ${why}`
    ])
    // a value the schema refuses too: one line, and the schema's words (which quote it) never print it raw
    const hostPort = problemsOf(`[agent]\nlisten_grpc = "a\\u0000:1"\n${MODEL}`)
    expect(hostPort).toEqual([`agent.listen_grpc: a NUL character (\\u0000) in "a\\u0000:1": ${why}`])
    expect(problemsOf(`[agent]\n"x\\u0000" = 1\n${MODEL}`).join("\n")).not.toContain("\0")
  })

  // RawValues.ts: a secret's value stays unprinted here too, as in the schema's type errors
  it.each([
    ["engine.api_key", `[engine]\napi_key = "SECRETKEY\\u0000x"\n${MODEL}`],
    ["cluster.etcd_password", `[cluster]\netcd_password = "SECRETKEY\\u0000x"\n${MODEL}`],
    ["agent.admin_token", `[agent]\nadmin_token = "SECRETKEY\\u0000x"\n${MODEL}`],
    ["engine.env.HF_TOKEN", `[engine]\nenv = { HF_TOKEN = "SECRETKEY\\u0000x" }\n${MODEL}`]
  ])("in a secret (%s): where it is, not the value", (key, text) => {
    const problems = problemsOf(text)
    expect(problems[0]).toBe(
      `${key}: a NUL character (\\u0000) in the value (not shown: a secret's key) at character 10: ${why}`
    )
    expect(problems.join("\n")).not.toContain("SECRETKEY")
  })
})

describe("a TOML date-time where a table goes is refused, not read as an empty section", () => {
  it.each([
    ["agent = 1979-05-27T07:32:00Z\n", "agent"],
    ["kv = 07:32:00\n", "kv"],
    ["[engine]\nenv = 1979-05-27T07:32:00Z\n", "engine.env"],
    ["[models.m]\nhf_repo = 1979-05-27\n", null],
    ["models = 1979-05-27\n", "models"],
    ['[models]\n"m" = 1979-05-27\n', 'models."m"']
  ])("%s", (text, key) => {
    const file = text.includes("models") ? text : `${text}${MODEL}`
    if (key === null) expect(problemsOf(file)).toEqual(['models."m".hf_repo: expected a string, got a date-time'])
    else expect(problemsOf(file)).toEqual([`${key}: expected a table, got a date-time`])
  })
})

describe("the values as written are walked only where the schema goes", () => {
  it("a table header 5000 deep is an unknown key, not a stack overflow", () => {
    expect(problemsOf(`[${"a.".repeat(4999)}a]\n${MODEL}`)).toEqual(['a: unknown key; did you mean "kv"?'])
  })
})

describe("etcd settings etcd itself refuses", () => {
  const ETCD = '[cluster]\netcd = ["http://127.0.0.1:2379"]\n'
  const longest =
    "etcd's longest lease, 9000000000s (MaxLeaseTTL): etcd refuses to grant it, so the node would never register"
  it("a lease TTL past etcd's MaxLeaseTTL, set or 3 heartbeats; fine standalone and at the limit", () => {
    expect(problemsOf(`${ETCD}[agent]\nlease_ttl = "300000d"\n${MODEL}`)).toEqual([
      `agent.lease_ttl: 25920000000s is longer than ${longest}`
    ])
    expect(problemsOf(`${ETCD}[agent]\nheartbeat = "100000d"\n${MODEL}`)).toEqual([
      `agent.heartbeat: the lease TTL (agent.lease_ttl unset: 3 x heartbeat = 25920000000s) is longer than ${longest}; set a shorter heartbeat`
    ])
    expect(problemsOf(`[agent]\nlease_ttl = "300000d"\n${MODEL}`)).toEqual([])
    expect(problemsOf(`${ETCD}[agent]\nlease_ttl = "9000000000s"\n${MODEL}`)).toEqual([])
  })

  it("an endpoint with anything after the port (the etcd client dials it as written)", () => {
    for (const url of [
      "http://127.0.0.1:2379/v3",
      "http://127.0.0.1:2379/",
      "http://127.0.0.1:2379?x=1",
      "http://127.0.0.1:2379#f",
      "HTTP://127.0.0.1:2379"
    ])
      expect(problemsOf(`[cluster]\netcd = ["${url}"]\n${MODEL}`)).toEqual([
        `cluster.etcd[0]: expected an etcd endpoint such as "https://10.0.0.5:2379": scheme, host and port, nothing after the port (the etcd client dials what follows the scheme as written), got "${url}"`
      ])
    expect(problemsOf(`[cluster]\netcd = ["https://[::1]:2379", "https://etcd-0.etcd:2379"]\n${MODEL}`)).toEqual([])
  })

  it("an endpoint without a port (grpc-js would dial 443, whatever the scheme)", () => {
    const noPort = (i: number, url: string, fix: string) =>
      `cluster.etcd[${i}]: expected an etcd endpoint with a port, got "${url}", which has no port (the etcd client would dial 443): write it, e.g. "${fix}" (etcd's client port is 2379)`
    expect(
      problemsOf(
        `[cluster]\netcd = ["http://127.0.0.1:2379", "http://127.0.0.1", "https://[::1]", "http://etcd:"]\n${MODEL}`
      )
    ).toEqual([
      noPort(1, "http://127.0.0.1", "http://127.0.0.1:2379"),
      noPort(2, "https://[::1]", "https://[::1]:2379"),
      noPort(3, "http://etcd:", "http://etcd:2379")
    ])
    // a scheme's default port written out is a port (the URL parser would drop it)
    expect(problemsOf(`[cluster]\netcd = ["https://etcd:443", "https://[::1]:2379"]\n${MODEL}`)).toEqual([])
  })

  it("port 0, and a port past 65535 named as the problem (not the URL's form)", () => {
    expect(problemsOf(`[cluster]\netcd = ["http://127.0.0.1:0"]\n${MODEL}`)).toEqual([
      'cluster.etcd[0]: expected an etcd endpoint with a port to dial, got "http://127.0.0.1:0": port 0 is none'
    ])
    expect(problemsOf(`[cluster]\netcd = ["http://127.0.0.1:99999"]\n${MODEL}`)).toEqual([
      'cluster.etcd[0]: expected an http:// or https:// URL, got "http://127.0.0.1:99999": port 99999 is past 65535'
    ])
  })

  it("one scheme for every endpoint (the etcd client throws on a mix), and TLS files only with https://", () => {
    expect(problemsOf(`[cluster]\netcd = ["http://a:2379", "https://b:2379"]\n${MODEL}`)).toEqual([
      "cluster.etcd: mixes http:// and https:// endpoints, which the etcd client refuses; give every endpoint the same scheme (https:// with cluster.etcd_ca_file for TLS)"
    ])
    expect(problemsOf(`[cluster]\netcd = ["http://a:2379"]\netcd_ca_file = "/ca.pem"\n${MODEL}`)).toEqual([
      "cluster.etcd_ca_file: set, but cluster.etcd's endpoints are http://, which the etcd client would then reach with TLS all the same and never connect; write them https://, or remove the etcd TLS files for plain HTTP"
    ])
    const pair = 'etcd_cert_file = "/c.pem"\netcd_key_file = "/k.pem"\n'
    expect(problemsOf(`[cluster]\netcd = ["http://a:2379"]\n${pair}${MODEL}`)[0]).toMatch(
      /^cluster\.etcd_cert_file: set, but/
    )
    expect(problemsOf(`[cluster]\netcd = ["https://a:2379"]\netcd_ca_file = "/ca.pem"\n${pair}${MODEL}`)).toEqual([])
  })
})

describe("ports: tcp://host:port endpoints, and port + the last DP rank at most 65535", () => {
  const zmq = (s: string) =>
    `kv.events_endpoint: expected a ZMQ endpoint such as "tcp://127.0.0.1:5557", "tcp://*:5557" or "ipc:///run/kv.sock", got "${s}"`
  it("KV events and replay ports, NIXL's side channel (vLLM, nixl)", () => {
    const dp2 = `${MODEL}dp = 2\n`
    expect(problemsOf(`[kv]\nevents = true\nevents_endpoint = "tcp://127.0.0.1:65535"\n${dp2}`)).toEqual([
      'kv.events_endpoint: with models."m".dp = 2, rank r publishes KV events on port 65535 + r, up to 65536, past 65535; use a port of at most 65534'
    ])
    expect(problemsOf(`[kv]\nevents = true\nreplay_endpoint = "tcp://*:65535"\n${dp2}`)).toEqual([
      'kv.replay_endpoint: with models."m".dp = 2, rank r answers replays on port 65535 + r, up to 65536, past 65535; use a port of at most 65534'
    ])
    expect(problemsOf(`[engine]\nkv_offload = "nixl"\nside_channel_port = 65535\n${dp2}`)).toEqual([
      'engine.side_channel_port: with models."m".dp = 2, the engine\'s rank r listens for KV-transfer handshakes on port 65535 + r, up to 65536, past 65535; use a port of at most 65534'
    ])
    // unused: events off, no nixl; or dp = 1
    expect(
      problemsOf(`[kv]\nevents_endpoint = "tcp://127.0.0.1:65535"\n[engine]\nside_channel_port = 65535\n${dp2}`)
    ).toEqual([])
    expect(problemsOf(`[kv]\nevents = true\nevents_endpoint = "tcp://127.0.0.1:65535"\n${MODEL}`)).toEqual([])
  })

  it("a tcp:// endpoint names a host and a port from 1", () => {
    expect(problemsOf(`[kv]\nevents_endpoint = "tcp://a:b:5557"\n${MODEL}`)).toEqual([
      `${zmq("tcp://a:b:5557")}: a:b is no host (an IPv6 address goes in brackets: "tcp://[::1]:5557")`
    ])
    expect(problemsOf(`[kv]\nevents_endpoint = "tcp://127.0.0.1:0"\n${MODEL}`)).toEqual([
      `${zmq("tcp://127.0.0.1:0")}: port 0 is no port the other side can find; give a fixed port`
    ])
    for (const ok of ["tcp://*:5557", "tcp://[::1]:5557", "tcp://eth0:5557", "tcp://kv.local:5557"])
      expect(problemsOf(`[kv]\nevents_endpoint = "${ok}"\n${MODEL}`), ok).toEqual([])
  })
})

describe("integer keys take TOML integers only", () => {
  const float = (key: string, v: number) =>
    `${key}: expected an integer, got the float ${v} (a decimal point or an exponent makes a TOML float); write ${v}`
  it("a float with a whole value is refused where an int goes, by the TOML type", () => {
    const text = `[agent]\nmax_inflight = 1e3\n[engine]\nside_channel_port = 5.6e3\nignore_xids = [92.0]\n${MODEL}tp = 1.0\ngpus = [0.0]\n`
    expect(problemsOf(text)).toEqual([
      float("agent.max_inflight", 1000),
      float("engine.side_channel_port", 5600),
      float("engine.ignore_xids[0]", 92),
      float('models."m".tp', 1),
      float('models."m".gpus[0]', 0)
    ])
  })

  it("floats where a number goes, integers past 2^53 in one line, whole numbers from an object", () => {
    expect(problemsOf(`${MODEL}gpu_memory_utilization = 1.0\n`)).toEqual([])
    expect(problemsOf(`[engine]\nkv_offload = "kvbm"\nkvbm_cpu_cache_gb = 4.0\n${MODEL}`)).toEqual([])
    expect(problemsOf(`[agent]\nmax_request_bytes = 9007199254740993\n${MODEL}`)).toEqual([
      "agent.max_request_bytes: expected at most 9007199254740991 (the largest integer a JavaScript number holds exactly), got 9007199254740993"
    ])
    // no TOML type to tell: an object's whole number is an integer
    const tp = Number("1.0")
    const r = decodeConfigObject({ agent: { max_inflight: 1e3 }, models: { m: { hf_repo: "a/b", tp } } }, undefined, {})
    expect(Result.isSuccess(r)).toBe(true)
  })

  it("the exact-integer bound is -(2^53-1) to 2^53-1, both ends, each end itself taken", () => {
    const exact = (v: string) =>
      `agent.max_request_bytes: expected at least -9007199254740991 (the least integer a JavaScript number holds exactly), got ${v}`
    // 2^53-1 is held exactly: judged by the key's own bounds (none above), not as inexact
    expect(problemsOf(`[agent]\nmax_request_bytes = 9007199254740991\n${MODEL}`)).toEqual([])
    expect(problemsOf(`[agent]\nmax_request_bytes = -9007199254740993\n${MODEL}`)).toEqual([exact("-9007199254740993")])
    expect(problemsOf(`[agent]\nmax_request_bytes = -9007199254740991\n${MODEL}`)).toEqual([
      "agent.max_request_bytes: expected at least 1, got -9007199254740991"
    ])
  })

  it("a float where a string goes is the schema's type error, not the integer rule's", () => {
    expect(problemsOf("[models.m]\nhf_repo = 1.0\n")).toEqual(['models."m".hf_repo: expected a string, got 1'])
  })
})

describe("dist/main.js check", () => {
  it("a NUL: exit 2, the key, the character escaped, no stack trace", async () => {
    requireDist()
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-config-nul-"))
    try {
      const file = path.join(dir, "nul.toml")
      await fs.writeFile(file, `[engine]\nargs = ["--x\\u0000"]\n${MODEL}`)
      const r = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
        execFile(process.execPath, [agentEntry, "check", "--offline", "--config", file], (error, stdout, stderr) =>
          resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout, stderr })
        )
      )
      expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 2, stdout: "" })
      expect(r.stderr).toContain('engine.args[0]: a NUL character (\\u0000) in "--x\\u0000"')
      expect(r.stderr).not.toContain("\0")
      expect(r.stderr).not.toMatch(/\n\s+at /)
    } finally {
      await fs.rm(dir, { recursive: true, force: true })
    }
  }, 60_000)
})

// ConfigSchema.ts: ListModels' max_model_len is a uint32; a larger one made every ListModels fail INTERNAL
describe("models.<name>.max_model_len fits ListModels' uint32", () => {
  it("4294967295 is taken, 4294967296 refused naming the key", () => {
    expect(problemsOf(`${MODEL}max_model_len = 4294967295\n`)).toEqual([])
    const refused = problemsOf(`${MODEL}max_model_len = 4294967296\n`)
    expect(refused).toHaveLength(1)
    expect(refused[0]).toMatch(/^models\."m"\.max_model_len: .*4294967295/)
  })
})
