// engine.api_key: the config's checks (layers/config/engineKeyChecks.ts and the env fallback in decodeConfig.ts), the
// key on the rendered plan (layers/engine/backends/engineKey.ts) and its redaction, and the live client, probe and
// metrics read sending it, against a loopback server that records what it is sent. The engines refusing calls without
// it: test/programs/engine-key-e2e.test.ts (the simulator as vLLM and SGLang), test/real/llama-cpp-api-key.test.ts.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Result } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { REDACTED, redactPlan } from "../../src/layers/engine/backends/redact.ts"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import { planFor } from "../../src/layers/engine/EnginePlan.ts"
import { probeOnce } from "../../src/layers/engine/probe.ts"
import { formatPlan } from "../../src/programs/render.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { complete, EngineClient } from "../../src/services/engine/EngineClient.ts"

type Raw = Record<string, Record<string, unknown>>
const KEY = "sk-engine-1"

const decode = (raw: Raw, env: Record<string, string> = {}) =>
  decodeConfigObject({ models: { m: { hf_repo: "org/m" } }, ...raw }, undefined, { NODE_NAME: "n", ...env })

const config = (raw: Raw, env?: Record<string, string>): AgentConfig => {
  const r = decode(raw, env)
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

const problems = (raw: Raw, env?: Record<string, string>): ReadonlyArray<string> => {
  const r = decode(raw, env)
  return Result.isFailure(r) ? r.failure.problems : []
}

const plan = (raw: Raw, env?: Record<string, string>): LaunchPlan => Effect.runSync(planFor(config(raw, env), []))

describe("engine.api_key in the config", () => {
  it("is read from the file, else from CGN_AGENT_ENGINE_API_KEY, trimmed; the file's wins", () => {
    expect(config({ engine: { api_key: KEY } }).engine.api_key).toBe(KEY)
    expect(config({}, { CGN_AGENT_ENGINE_API_KEY: ` ${KEY}\n` }).engine.api_key).toBe(KEY)
    expect(config({ engine: { api_key: "from-file" } }, { CGN_AGENT_ENGINE_API_KEY: KEY }).engine.api_key).toBe(
      "from-file"
    )
    expect(config({}).engine.api_key).toBeUndefined()
  })

  it("a key a header cannot carry is refused, naming where it came from and never showing it", () => {
    expect(problems({ engine: { api_key: "a b" } })).toEqual([
      "engine.api_key: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)"
    ])
    expect(problems({}, { CGN_AGENT_ENGINE_API_KEY: "  " })).toEqual([
      "CGN_AGENT_ENGINE_API_KEY: only whitespace; set a token or remove it"
    ])
    expect(problems({}, { CGN_AGENT_ENGINE_API_KEY: "x\u0001y" })).toEqual([
      "CGN_AGENT_ENGINE_API_KEY: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)"
    ])
    expect(problems({ engine: { api_key: 12345 } })).toEqual([
      "engine.api_key: expected a string, got a number (not shown: a secret's key)"
    ])
    // DEL is a control character too: undici refuses it in a header value
    expect(problems({ engine: { api_key: "a\u007fb" } })).toEqual([
      "engine.api_key: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)"
    ])
    expect(problems({}, { CGN_AGENT_ADMIN_TOKEN: "a\u007fb" })).toEqual([
      "CGN_AGENT_ADMIN_TOKEN: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)"
    ])
  })

  it("an empty variable (envFrom of an unset value) is no key, not a whitespace-only one", () => {
    const c = config({}, { CGN_AGENT_ENGINE_API_KEY: "", CGN_AGENT_ADMIN_TOKEN: "" })
    expect([c.engine.api_key, c.agent.admin_token]).toEqual([undefined, undefined])
    expect(plan({}, { CGN_AGENT_ENGINE_API_KEY: "" }).authorization).toBeUndefined()
  })

  it("an engine that takes no key (mlx-lm) is refused one, from the file or the environment", () => {
    const why =
      "mlx-lm takes no API key, so it would serve any caller without one; remove it, and keep engine.url where only the agent reaches it (loopback)"
    expect(problems({ engine: { kind: "mlx", api_key: KEY } })).toEqual([`engine.api_key: ${why}`])
    expect(problems({ engine: { kind: "mlx" } }, { CGN_AGENT_ENGINE_API_KEY: KEY })).toEqual([
      `CGN_AGENT_ENGINE_API_KEY: ${why}`
    ])
    expect(problems({ engine: { kind: "openai_compat", api_key: KEY } })).toEqual([])
  })

  it("a key handed to the engine another way is refused: the agent would not send it", () => {
    const instead = (name: string) =>
      `set engine.api_key instead: the agent hands it to ${name} and sends it with every call`
    expect(problems({ engine: { env: { VLLM_API_KEY: "x" } } })).toEqual([
      `engine.env.VLLM_API_KEY: gives vLLM a key the agent does not send (its calls could be answered 401); ${instead("vLLM")}`
    ])
    expect(problems({ engine: { args: ["--api-key", "x"] } })).toEqual([
      `engine.args: --api-key gives vLLM a key the agent does not send (its calls could be answered 401); ${instead("vLLM")}`
    ])
    expect(
      problems({
        engine: { kind: "llama_cpp", api_key: KEY, env: { LLAMA_API_KEY: "x" } },
        models: { m: { path: "/m.gguf", args: ["--api-key-file=/k", "--api-key", "y"] } }
      })
    ).toEqual([
      `engine.env.LLAMA_API_KEY: gives llama-server a key the agent does not send (its calls could be answered 401); ${instead("llama-server")}`,
      `models."m".args: --api-key, --api-key-file gives llama-server a key the agent does not send (its calls could be answered 401); ${instead("llama-server")}`
    ])
    expect(problems({ engine: { kind: "sglang", args: ["--api-key=x"] } })).toEqual([
      `engine.args: --api-key gives SGLang a key the agent does not send (its calls could be answered 401); ${instead("SGLang")}`
    ])
    // a flag is matched whole (or as `flag=`): --api-key-file alone is not also --api-key
    expect(
      problems({ engine: { kind: "llama_cpp" }, models: { m: { path: "/m.gguf", args: ["--api-key-file", "/k"] } } })
    ).toEqual([
      `models."m".args: --api-key-file gives llama-server a key the agent does not send (its calls could be answered 401); ${instead("llama-server")}`
    ])
    // the spellings the engines' parsers take: vLLM's underscores, argparse's unique prefixes (code review)
    for (const [kind, args, flag] of [
      ["vllm", ["--api_key", "x"], "--api-key"],
      ["vllm", ["--api_key=x"], "--api-key"],
      ["sglang", ["--api-ke", "x"], "--api-key"],
      ["llama_cpp", ["--api-key-f=/k"], "--api-key-file"]
    ] as const)
      expect(
        problems({ engine: { kind, args: [...args] }, models: { m: { path: "/m.gguf" } } })[0],
        args.join(" ")
      ).toMatch(new RegExp(`^engine.args: ${flag} gives`))
    // a key in the agent's own environment, which a spawned engine inherits (README audit): refused unless the
    // agent's key replaces it; a proxied server inherits nothing
    const inherited = `in the agent's environment, which llama-server inherits: a key the agent does not send (its calls would be answered 401); set CGN_AGENT_ENGINE_API_KEY (or engine.api_key) instead: the agent hands it to llama-server and sends it with every call`
    const llama = { engine: { kind: "llama_cpp" }, models: { m: { path: "/m.gguf" } } }
    expect(problems(llama, { LLAMA_API_KEY: "x" })).toEqual([`LLAMA_API_KEY: ${inherited}`])
    expect(problems(llama, { LLAMA_ARG_API_KEY_FILE: "/k" })).toEqual([`LLAMA_ARG_API_KEY_FILE: ${inherited}`])
    expect(problems(llama, { LLAMA_API_KEY: "x", CGN_AGENT_ENGINE_API_KEY: KEY })).toEqual([])
    expect(problems(llama, { LLAMA_API_KEY: "" })).toEqual([])
    expect(problems({}, { VLLM_API_KEY: "x" })[0]).toMatch(
      /^VLLM_API_KEY: in the agent's environment, which vLLM inherits/
    )
    expect(problems({ engine: { kind: "openai_compat" } }, { VLLM_API_KEY: "x" })).toEqual([])
    // not a key flag of SGLang's: its admin key guards admin routes only
    expect(problems({ engine: { kind: "sglang", args: ["--admin-api-key", "x"] } })).toEqual([])
  })
})

describe("engine.api_key on the plan", () => {
  const bearer = `Bearer ${KEY}`

  it("vLLM and llama-server get it in their environment, SGLang on its command line (it reads no variable)", () => {
    const v = plan({ engine: { api_key: KEY } })
    expect(v.env.VLLM_API_KEY).toBe(KEY)
    expect(v.argv).not.toContain(KEY)
    const l = plan({ engine: { kind: "llama_cpp", api_key: KEY }, models: { m: { path: "/m.gguf" } } })
    expect(l.env.LLAMA_API_KEY).toBe(KEY)
    expect(l.argv).not.toContain(KEY)
    const s = plan({ engine: { kind: "sglang", api_key: KEY } })
    expect(s.argv.slice(-2)).toEqual(["--api-key", KEY])
    expect(Object.values(s.env)).not.toContain(KEY)
    for (const p of [v, l, s]) {
      expect([p.authorization, p.probe.authorization, p.liveness?.authorization]).toEqual([bearer, bearer, bearer])
    }
  })

  it("the key joins the engine's other variables (engine.env, the backend's own), replacing none", () => {
    for (const [kind, variable] of [
      ["vllm", "VLLM_API_KEY"],
      ["llama_cpp", "LLAMA_API_KEY"]
    ] as const) {
      const raw: Raw = { engine: { kind, env: { FOO: "bar" } }, models: { m: { path: "/m.gguf" } } }
      const without = plan(raw)
      const keyed = plan({ ...raw, engine: { ...raw.engine, api_key: KEY } })
      expect(keyed.env).toEqual({ ...without.env, [variable]: KEY })
      expect(keyed.env.FOO).toBe("bar")
    }
  })

  it("a probe on the engine's host and port but another scheme is another origin: not given the key", () => {
    for (const probe of ["https://127.0.0.1:8000/health", "http://127.0.0.1:8000/health"]) {
      const p = plan({
        engine: { kind: "openai_compat", url: "http://127.0.0.1:8000", api_key: KEY },
        agent: { ready_probe_url: probe }
      })
      expect(p.probe).toEqual(
        probe.startsWith("https:")
          ? { kind: "http", url: probe, keyWithheld: true }
          : { kind: "http", url: probe, authorization: `Bearer ${KEY}` }
      )
    }
  })

  it("a proxied server's key is only sent; a probe on another origin is not given it", () => {
    const p = plan({
      engine: { kind: "openai_compat", url: "https://gw.example:8443", api_key: KEY },
      agent: { ready_probe_url: "http://sidecar:9000/ready" }
    })
    expect([p.argv, p.env, p.authorization]).toEqual([[], {}, bearer])
    expect(p.probe).toEqual({ kind: "http", url: "http://sidecar:9000/ready", keyWithheld: true })
    const same = plan({ engine: { kind: "openai_compat", url: "https://gw.example:8443", api_key: KEY } })
    expect(same.probe.authorization).toBe(bearer)
  })

  it("without a key nothing is added", () => {
    const p = plan({})
    expect([p.authorization, p.probe.authorization, p.env.VLLM_API_KEY]).toEqual([undefined, undefined, undefined])
  })

  it("render shows neither the key nor its header", () => {
    for (const raw of [{ engine: { api_key: KEY } }, { engine: { kind: "sglang", api_key: KEY } }]) {
      const shown = redactPlan(plan(raw))
      expect(JSON.stringify(shown)).not.toContain(KEY)
      expect(shown.authorization).toBe(`Bearer ${REDACTED}`)
      expect(shown.probe.authorization).toBe(`Bearer ${REDACTED}`)
      expect(formatPlan(shown)).not.toContain(KEY)
      expect(formatPlan(shown)).toContain("(each request with the engine's API key: engine.api_key)")
    }
  })
})

describe("the live client, probe and metrics read send it", () => {
  const seen: Array<[string, string | undefined]> = []
  let status = 200
  let server: http.Server
  let url: string
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      seen.push([`${req.method} ${req.url}`, req.headers.authorization])
      req.resume()
      req.on("end", () => {
        if (status !== 200) return void res.writeHead(status).end('{"error":"Unauthorized"}')
        if (req.url === "/metrics") return void res.writeHead(200).end("vllm:num_requests_running 1\n")
        if (req.url === "/v1/models") return void res.writeHead(200).end('{"data":[]}')
        res.writeHead(200, { "content-type": "application/json" }).end('{"choices":[{"text":"a"}]}')
      })
    })
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((r) => server.close(r))
  })

  it("every request to the engine carries `Authorization: Bearer <key>`", async () => {
    seen.length = 0
    const p = plan({ engine: { url, api_key: KEY } })
    await Effect.runPromise(
      Effect.gen(function* () {
        const client = yield* EngineClient
        yield* complete(client, "/v1/completions", { prompt: "p", max_tokens: 1 })
        yield* client.load
      }).pipe(Effect.provide(layerFromPlan(p)))
    )
    expect(await Effect.runPromise(probeOnce(p.probe, 2_000))).toEqual({ ok: true })
    expect(seen).toEqual([
      ["POST /v1/completions", `Bearer ${KEY}`],
      ["GET /metrics", `Bearer ${KEY}`],
      ["GET /v1/models", `Bearer ${KEY}`]
    ])
  })

  it("a probe answered 401 or 403 says the engine wants a key or refuses this one, not 'loading'", async () => {
    status = 401
    try {
      const without = plan({ engine: { url } })
      expect(await Effect.runPromise(probeOnce(without.probe, 2_000))).toEqual({
        ok: false,
        reason: "HTTP 401: the engine asks for an API key: set engine.api_key",
        phase: "unauthorized"
      })
      // set, but not sent: ready_probe_url names the same server another way (code review)
      const elsewhere = plan({
        engine: { url, api_key: KEY },
        agent: { ready_probe_url: `${url.replace("127.0.0.1", "localhost")}/v1/models` }
      })
      expect(await Effect.runPromise(probeOnce(elsewhere.probe, 2_000))).toEqual({
        ok: false,
        reason:
          "HTTP 401: the engine asks for an API key, and engine.api_key goes to engine.url's origin alone: give agent.ready_probe_url its scheme, host and port",
        phase: "unauthorized"
      })
      status = 403
      const wrong = plan({ engine: { url, api_key: "other" } })
      expect(await Effect.runPromise(probeOnce(wrong.probe, 2_000))).toEqual({
        ok: false,
        reason: "HTTP 403: the engine refuses engine.api_key",
        phase: "unauthorized"
      })
    } finally {
      status = 200
    }
  })
})
