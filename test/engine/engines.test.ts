// Golden launch plans for every valid engine x kv_offload x role, with the argv written out literally and
// checked against the upstream flag spellings (vLLM vllm/engine/arg_utils.py, SGLang python/sglang/srt/server_args.py,
// llama.cpp common/arg.cpp, mlx-lm mlx_lm/server.py); then every invalid
// combination with its exact message, and the shared rendering rules (command override, env, probe, KV events);
// and `cgn-agent render`'s text of a plan (programs/render.ts formatPlan).
import { Effect, Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineBinds } from "../../src/layers/engine/backends/common.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { REDACTED, redactPlan } from "../../src/layers/engine/backends/redact.ts"
import { planFor } from "../../src/layers/engine/EnginePlan.ts"
import { formatPlan, shellQuote } from "../../src/programs/render.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { EngineKinds, KvOffloads, Roles } from "../../src/services/config/ConfigSchema.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { gpuWith } from "../../src/services/node/Nvml.ts"
import { parseArgs as parseSimArgs } from "../../src/sim/args.ts"

const ENV = { NODE_NAME: "node-1" }

type Raw = Record<string, Record<string, unknown>>

const decode = (raw: Raw) => decodeConfigObject({ models: { m: { hf_repo: "org/m", tp: 2 } }, ...raw }, undefined, ENV)

const config = (raw: Raw): AgentConfig => {
  const r = decode(raw)
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

const plan = (raw: Raw): LaunchPlan => {
  const c = config(raw)
  return engineFor(c.engine.kind).render(c)
}

const problems = (raw: Raw): ReadonlyArray<string> => {
  const r = decode(raw)
  return Result.isFailure(r) ? r.failure.problems : []
}

const NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail"}'
const LMCACHE = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
const KVBM =
  '{"kv_connector":"DynamoConnector","kv_role":"kv_both","kv_connector_module_path":"kvbm.vllm_integration.connector"}'

const VLLM = ["vllm", "serve", "org/m", "--host", "127.0.0.1", "--port", "8000"]
const VLLM_TAIL = ["--tensor-parallel-size", "2", "--served-model-name", "m"]
const SGL_URL = "http://127.0.0.1:30000"
const SGL = ["python", "-m", "sglang.launch_server", "--model-path", "org/m", "--host", "127.0.0.1", "--port", "30000"]
const SGL_TAIL = ["--tp-size", "2", "--served-model-name", "m", "--enable-metrics"]
const HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "2"]
const NIXL_ENV = { VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: "5600" }

/** [engine, kv_offload, role, argv, env]: every combination the engines can run. */
const golden: ReadonlyArray<[string, string, string, ReadonlyArray<string>, Record<string, string>]> = [
  ["vllm", "none", "both", [...VLLM, ...VLLM_TAIL], {}],
  ["vllm", "nixl", "both", [...VLLM, ...VLLM_TAIL, "--kv-transfer-config", NIXL], NIXL_ENV],
  ["vllm", "lmcache", "both", [...VLLM, ...VLLM_TAIL, "--kv-transfer-config", LMCACHE], {}],
  ["vllm", "kvbm", "both", [...VLLM, ...VLLM_TAIL, "--kv-transfer-config", KVBM], {}],
  ["vllm", "nixl", "prefill", [...VLLM, ...VLLM_TAIL, "--kv-transfer-config", NIXL], NIXL_ENV],
  ["vllm", "nixl", "decode", [...VLLM, ...VLLM_TAIL, "--kv-transfer-config", NIXL], NIXL_ENV],
  ["sglang", "none", "both", [...SGL, ...SGL_TAIL], {}],
  ["sglang", "hicache", "both", [...SGL, ...SGL_TAIL, ...HICACHE], {}],
  ["sglang", "lmcache", "both", [...SGL, ...SGL_TAIL, "--enable-lmcache"], {}],
  [
    "sglang",
    "none",
    "prefill",
    [
      ...SGL,
      ...SGL_TAIL,
      "--disaggregation-mode",
      "prefill",
      "--disaggregation-transfer-backend",
      "mooncake",
      "--disaggregation-bootstrap-port",
      "8998"
    ],
    {}
  ],
  [
    "sglang",
    "none",
    "decode",
    [...SGL, ...SGL_TAIL, "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake"],
    {}
  ],
  [
    "sglang",
    "hicache",
    "prefill",
    [
      ...SGL,
      ...SGL_TAIL,
      ...HICACHE,
      "--disaggregation-mode",
      "prefill",
      "--disaggregation-transfer-backend",
      "mooncake",
      "--disaggregation-bootstrap-port",
      "8998"
    ],
    {}
  ],
  [
    "sglang",
    "hicache",
    "decode",
    [
      ...SGL,
      ...SGL_TAIL,
      ...HICACHE,
      "--disaggregation-mode",
      "decode",
      "--disaggregation-transfer-backend",
      "mooncake",
      "--disaggregation-decode-enable-radix-cache"
    ],
    {}
  ],
  [
    "sglang",
    "lmcache",
    "prefill",
    [
      ...SGL,
      ...SGL_TAIL,
      "--enable-lmcache",
      "--disaggregation-mode",
      "prefill",
      "--disaggregation-transfer-backend",
      "mooncake",
      "--disaggregation-bootstrap-port",
      "8998"
    ],
    {}
  ],
  [
    "sglang",
    "nixl",
    "prefill",
    [
      ...SGL,
      ...SGL_TAIL,
      "--disaggregation-mode",
      "prefill",
      "--disaggregation-transfer-backend",
      "nixl",
      "--disaggregation-bootstrap-port",
      "8998"
    ],
    {}
  ],
  [
    "sglang",
    "nixl",
    "decode",
    [...SGL, ...SGL_TAIL, "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"],
    {}
  ],
  [
    "llama_cpp",
    "none",
    "both",
    ["llama-server", "-hf", "org/m", "-a", "m", "--host", "127.0.0.1", "--port", "8080", "-ngl", "999", "--metrics"],
    {}
  ],
  ["mlx", "none", "both", ["mlx_lm.server", "--model", "org/m", "--host", "127.0.0.1", "--port", "8080"], {}],
  ["openai_compat", "none", "both", [], {}]
]

const urlFor: Record<string, string> = {
  vllm: "http://127.0.0.1:8000",
  sglang: SGL_URL,
  llama_cpp: "http://127.0.0.1:8080",
  mlx: "http://127.0.0.1:8080",
  openai_compat: "http://127.0.0.1:8000"
}

/** The raw config of one combination; engines without tensor parallelism get tp 1. */
const combo = (kind: string, kv: string, role: string): Raw => ({
  engine: { kind, kv_offload: kv, url: urlFor[kind] },
  agent: { role },
  models: { m: { hf_repo: "org/m", tp: ["llama_cpp", "mlx"].includes(kind) ? 1 : 2 } }
})

describe("golden plans: every valid engine x kv_offload x role", () => {
  it.each(golden)("%s kv_offload=%s role=%s", (kind, kv, role, argv, env) => {
    const p = plan(combo(kind, kv, role))
    expect(p.argv).toEqual(argv)
    expect(p.env).toEqual(env)
    expect(p.kind).toBe(kind)
    expect(p.spawns).toBe(kind !== "openai_compat")
    expect(p.baseUrl).toBe(urlFor[kind])
  })

  // The simulator accepts flags it does not model (an operator's engine.args), as a real engine would not
  // accept an unknown one: so every flag the agent renders must be one the simulator models, each taken from the
  // engine's own argument parser, or a renderer's typo would pass every test and fail on the real engine.
  it("every flag a plan renders is one the simulator models for that engine", () => {
    const unmodelled = golden
      .filter(([kind]) => kind !== "openai_compat")
      .flatMap(([kind, kv, role]) => {
        const { argv, env } = plan(combo(kind, kv, role))
        return parseSimArgs(["--flavor", kind, ...argv], { DYN_KVBM_CPU_CACHE_GB: "1", ...env }).unmodelled.map(
          (flag) => `${kind}/${kv}/${role}: ${flag}`
        )
      })
    expect(unmodelled).toEqual([])
  })

  it("the table covers every combination the config accepts, and no other", () => {
    const accepted: Array<string> = []
    for (const kind of EngineKinds)
      for (const kv of KvOffloads)
        for (const role of Roles)
          if (problems(combo(kind, kv, role)).length === 0) accepted.push(`${kind}/${kv}/${role}`)
    expect(accepted.sort()).toEqual(golden.map(([k, kv, r]) => `${k}/${kv}/${r}`).sort())
  })
})

describe("invalid combinations", () => {
  const offloads = (kind: string) =>
    ({
      vllm: '"none", "nixl", "lmcache", "kvbm"',
      sglang: '"none", "hicache", "lmcache", "nixl"',
      llama_cpp: '"none"',
      mlx: '"none"',
      openai_compat: '"none"'
    })[kind]
  const expected = (kind: string, kv: string, role: string): Array<string> => {
    const out: Array<string> = []
    const single = ["llama_cpp", "mlx", "openai_compat"].includes(kind)
    const kvOk = kind === "vllm" ? kv !== "hicache" : kind === "sglang" ? kv !== "kvbm" : kv === "none"
    if (!kvOk) out.push(`engine.kv_offload: ${kind} does not support "${kv}"; ${kind} supports ${offloads(kind)}`)
    if (single && role !== "both") {
      out.push(
        `agent.role: ${kind} cannot run role "${role}" (no prefill/decode disaggregation); ${kind} supports "both"`
      )
    }
    if (kind === "vllm" && kvOk && role !== "both" && kv !== "nixl") {
      out.push(
        `engine.kv_offload: vllm with agent.role = "${role}" needs kv_offload "nixl", got "${kv}" (the NIXL connector hands the prefilled KV cache to the decode instance)`
      )
    }
    if (kind === "sglang" && kv === "lmcache" && role === "decode") {
      out.push(
        'engine.kv_offload: sglang with agent.role = "decode" needs kv_offload "none", "hicache" or "nixl", got "lmcache" (an SGLang decode server has no radix cache, so LMCache would never be used; use it on the prefill server)'
      )
    }
    if (kind === "sglang" && kv === "nixl" && role === "both") {
      out.push(
        'engine.kv_offload: sglang with agent.role = "both" needs kv_offload "none", "hicache" or "lmcache", got "nixl" (SGLang uses "nixl" only as the prefill/decode transfer backend; set agent.role to "prefill" or "decode")'
      )
    }
    return out
  }
  const invalid = EngineKinds.flatMap((kind) =>
    KvOffloads.flatMap((kv) =>
      Roles.filter((role) => !golden.some(([k, o, r]) => k === kind && o === kv && r === role)).map(
        (role) => [kind, kv, role] as const
      )
    )
  )

  it("there are invalid combinations to check", () => {
    expect(invalid.length).toBe(EngineKinds.length * KvOffloads.length * Roles.length - golden.length)
  })

  it.each(invalid)("%s kv_offload=%s role=%s is refused", (kind, kv, role) => {
    const want = expected(kind, kv, role)
    expect(want.length).toBeGreaterThan(0)
    expect(problems(combo(kind, kv, role))).toEqual(want)
  })

  it.each([
    [{ engine: { kind: "llama_cpp" } }, 'models."m".tp: llama_cpp has no tensor parallelism; set tp = 1'],
    [{ engine: { kind: "mlx" } }, 'models."m".tp: mlx has no tensor parallelism; set tp = 1'],
    [
      { engine: { kind: "mlx" }, kv: { events: true } },
      "kv.events: mlx does not publish KV-cache events; set kv.events = false"
    ],
    [
      { engine: { kind: "openai_compat", command: ["x"] } },
      "engine.command: openai_compat proxies engine.url and starts nothing; remove engine.command"
    ],
    [
      { engine: { kind: "openai_compat", args: ["--x"] } },
      "engine.args: openai_compat proxies engine.url and starts nothing; remove engine.args"
    ],
    [
      { engine: { kind: "openai_compat", env: { A: "1" } } },
      "engine.env: openai_compat proxies engine.url and starts nothing; remove engine.env"
    ],
    [
      { engine: { kind: "openai_compat" }, models: { m: { hf_repo: "o/m", args: ["--x"] } } },
      'models."m".args: openai_compat starts nothing, so args are never used; remove them'
    ],
    [
      { engine: { kind: "llama_cpp", proxied_kind: "llama_cpp" } },
      'engine.proxied_kind: says what serves engine.url for kind = "openai_compat"; llama_cpp is the engine the agent starts itself, so remove it'
    ]
  ])("%j is refused", (raw, message) => {
    expect(problems(raw as Raw)).toContain(message)
  })

  it("a llama.cpp served name with a comma is refused (llama-server splits -a on commas)", () => {
    const why = "llama-server splits -a on commas into several aliases"
    expect(problems({ engine: { kind: "llama_cpp" }, models: { m: { hf_repo: "o/m", served_name: "a,b" } } })).toEqual([
      `models."m".served_name: llama_cpp cannot serve the name "a,b": it contains "," (${why}); set a served_name without it`
    ])
    expect(problems({ engine: { kind: "llama_cpp" }, models: { "x,y": { hf_repo: "o/m" } } })).toEqual([
      `models."x,y": llama_cpp cannot serve the name "x,y": it contains "," (${why}); set a served_name without it`
    ])
    expect(
      problems({ engine: { kind: "llama_cpp" }, models: { "x,y": { hf_repo: "o/m", served_name: "xy" } } })
    ).toEqual([])
    expect(problems({ models: { m: { hf_repo: "o/m", served_name: "a,b" } } })).toEqual([])
  })

  it("model settings an engine cannot express are refused", () => {
    const m = { hf_repo: "org/m", max_model_len: 4096, gpu_memory_utilization: 0.8 }
    expect(problems({ engine: { kind: "llama_cpp" }, models: { m } })).toEqual([
      'models."m".gpu_memory_utilization: llama_cpp has no command-line setting for gpu_memory_utilization; remove it'
    ])
    expect(problems({ engine: { kind: "mlx" }, models: { m } })).toEqual([
      'models."m".max_model_len: mlx has no command-line setting for max_model_len; remove it',
      'models."m".gpu_memory_utilization: mlx has no command-line setting for gpu_memory_utilization; remove it'
    ])
  })
})

describe("openai_compat told what it proxies (engine.proxied_kind)", () => {
  it("speaks as that engine (dialect, stop field, ignore_eos, output faults, connections, context) and stays a proxy", () => {
    const llama = engineFor("llama_cpp").capabilities
    const compat = engineFor("openai_compat").capabilities
    const told = engineFor("openai_compat", "llama_cpp").capabilities
    expect(told).toEqual({
      ...compat,
      displayName: "the proxied llama-server",
      requestDialect: llama.requestDialect,
      ignoreEos: true,
      outputFaults: llama.outputFaults,
      closesStreamedConnections: true,
      servedContext: llama.servedContext,
      metricNames: llama.metricNames
    })
    expect(engineFor("openai_compat", "vllm").capabilities.stopSequenceField).toBe("stop_reason")
    // mlx-lm's model list says no context: the generic reading stays
    expect(engineFor("openai_compat", "mlx").capabilities.servedContext).toEqual(compat.servedContext)
    // only openai_compat takes it
    expect(engineFor("vllm", "llama_cpp")).toBe(engineFor("vllm"))
  })

  it("its plan reads the proxied server's /metrics by that engine's series; told nothing or mlx, none", () => {
    const url = "http://10.0.0.7:8080"
    for (const kind of ["vllm", "sglang", "llama_cpp"] as const) {
      const p = plan({ engine: { kind: "openai_compat", url, proxied_kind: kind } })
      expect(p.metrics).toEqual({ url: `${url}/metrics`, names: engineFor(kind).capabilities.metricNames })
    }
    // the same names the spawned engine's plan is read by
    expect(plan({ engine: { kind: "vllm" } }).metrics?.names).toBe(engineFor("vllm").capabilities.metricNames)
    expect(plan({ engine: { kind: "openai_compat", url } }).metrics).toBeUndefined()
    expect(plan({ engine: { kind: "openai_compat", url, proxied_kind: "mlx" } }).metrics).toBeUndefined()
  })

  it("the plan carries it, and render says so", () => {
    const p = plan({ engine: { kind: "openai_compat", proxied_kind: "llama_cpp" } })
    expect(p.proxiedKind).toBe("llama_cpp")
    expect(formatPlan(p).split("\n")[0]).toBe(
      "engine:    openai_compat (not spawned: the agent proxies an existing llama_cpp server, and speaks as that engine)"
    )
  })
})

describe("P/D handoff capability", () => {
  it("each backend declares its handoff protocol; exactly those with one run prefill/decode roles", () => {
    const declared = Object.fromEntries(EngineKinds.map((k) => [k, engineFor(k).capabilities.handoff ?? "none"]))
    expect(declared).toEqual({
      vllm: "kv_transfer_params",
      sglang: "bootstrap",
      llama_cpp: "none",
      mlx: "none",
      openai_compat: "none"
    })
    for (const kind of EngineKinds) {
      const caps = engineFor(kind).capabilities
      const pd = caps.roles.includes("prefill") && caps.roles.includes("decode")
      expect([kind, pd]).toEqual([kind, caps.handoff !== undefined])
    }
  })

  // What NodeHealth.kv_transfer publishes, for a router to pair only nodes that can hand KV blocks to each other.
  it("a P/D plan names its KV transfer backend, the one its flags give; role both names none", () => {
    const transferOf = ([kind, kv, role]: (typeof golden)[number]) => plan(combo(kind, kv, role)).kvTransfer
    const named = golden.map((g) => `${g[0]}/${g[1]}/${g[2]}: ${transferOf(g)}`)
    expect(named.filter((n) => n.includes("/both:")).every((n) => n.endsWith(": undefined"))).toBe(true)
    expect(named.filter((n) => !n.includes("/both:"))).toEqual([
      "vllm/nixl/prefill: NixlConnector",
      "vllm/nixl/decode: NixlConnector",
      "sglang/none/prefill: mooncake",
      "sglang/none/decode: mooncake",
      "sglang/hicache/prefill: mooncake",
      "sglang/hicache/decode: mooncake",
      "sglang/lmcache/prefill: mooncake",
      "sglang/nixl/prefill: nixl",
      "sglang/nixl/decode: nixl"
    ])
    // the backend the engine is told (--disaggregation-transfer-backend) is the one published
    const sglang = plan(combo("sglang", "nixl", "decode"))
    expect(sglang.argv[sglang.argv.indexOf("--disaggregation-transfer-backend") + 1]).toBe(sglang.kvTransfer)
  })

  // README's recipe for HiCache over NIXL sets the backend in engine.args: argparse keeps the last flag, and so the
  // published value must (a router pairing by it would match the node with peers it cannot hand blocks to)
  it("an operator's flag in engine.args after the rendered one is the backend published, as the engine takes it", () => {
    const withArgs = (kind: string, kv: string, role: string, args: ReadonlyArray<string>) => {
      const raw = combo(kind, kv, role)
      return plan({ ...raw, engine: { ...raw.engine, args } }).kvTransfer
    }
    expect(withArgs("sglang", "hicache", "prefill", ["--disaggregation-transfer-backend", "nixl"])).toBe("nixl")
    expect(withArgs("sglang", "none", "decode", ["--disaggregation-transfer-backend=nixl"])).toBe("nixl")
    const mooncake = '{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}'
    expect(withArgs("vllm", "nixl", "decode", ["--kv-transfer-config", mooncake])).toBe("MooncakeConnector")
    // a value it cannot read leaves the rendered one (the engine refuses such a config at its start anyway)
    expect(withArgs("vllm", "nixl", "decode", ["--kv-transfer-config", "{"])).toBe("NixlConnector")
  })
})

describe("rendering rules", () => {
  it("model settings map to each engine's flags", () => {
    const models = { m: { path: "/models/m.gguf", max_model_len: 4096, gpu_memory_utilization: 0.8, tp: 1 } }
    expect(plan({ models }).argv).toEqual([
      "vllm",
      "serve",
      "/models/m.gguf",
      "--host",
      "127.0.0.1",
      "--port",
      "8000",
      "--tensor-parallel-size",
      "1",
      "--served-model-name",
      "m",
      "--max-model-len",
      "4096",
      "--gpu-memory-utilization",
      "0.8"
    ])
    expect(plan({ engine: { kind: "sglang" }, models }).argv.slice(3)).toEqual([
      "--model-path",
      "/models/m.gguf",
      "--host",
      "127.0.0.1",
      "--port",
      "8000",
      "--tp-size",
      "1",
      "--served-model-name",
      "m",
      "--context-length",
      "4096",
      "--mem-fraction-static",
      "0.8",
      "--enable-metrics"
    ])
    const llama = { m: { path: "/models/m.gguf", max_model_len: 4096, served_name: "small" } }
    expect(plan({ engine: { kind: "llama_cpp" }, models: llama }).argv).toEqual([
      "llama-server",
      "-m",
      "/models/m.gguf",
      "-a",
      "small",
      "--host",
      "127.0.0.1",
      "--port",
      "8000",
      "-c",
      "4096",
      "-ngl",
      "999",
      "--metrics"
    ])
  })

  it("[engine].command replaces the executable; model args, then engine args, come last", () => {
    const p = plan({
      engine: { command: ["node", "sim.ts", "--flavor", "vllm"], args: ["--engine-extra"] },
      models: { m: { hf_repo: "org/m", args: ["--model-extra"] } }
    })
    expect(p.argv).toEqual([
      process.execPath, // a first word `node` is the agent's own Node
      "sim.ts",
      "--flavor",
      "vllm",
      "serve",
      "org/m",
      "--host",
      "127.0.0.1",
      "--port",
      "8000",
      "--tensor-parallel-size",
      "1",
      "--served-model-name",
      "m",
      "--model-extra",
      "--engine-extra"
    ])
    const s = plan({ engine: { kind: "sglang", command: ["cgn-engine-sim"] } })
    expect(s.argv.slice(0, 3)).toEqual(["cgn-engine-sim", "--model-path", "org/m"])
  })

  it("host and port come from [engine].url, IPv6 without brackets", () => {
    const p = plan({ engine: { url: "http://[::1]:9000/" } })
    expect([p.host, p.port, p.baseUrl]).toEqual(["::1", 9000, "http://[::1]:9000"])
    expect(p.argv.slice(3, 7)).toEqual(["--host", "::1", "--port", "9000"])
    const q = plan({
      engine: { kind: "openai_compat", url: "https://api.internal" },
      models: { m: { hf_repo: "o/m" } }
    })
    expect([q.host, q.port, q.baseUrl]).toEqual(["api.internal", 443, "https://api.internal"])
  })

  it("[engine].env is applied over the engine's own variables", () => {
    const p = plan({
      engine: { kv_offload: "nixl", env: { VLLM_NIXL_SIDE_CHANNEL_PORT: "7000", UCX_TLS: "rc" } }
    })
    expect(p.env).toEqual({
      VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1",
      VLLM_NIXL_SIDE_CHANNEL_PORT: "7000",
      UCX_TLS: "rc"
    })
  })

  it("the NIXL side-channel host of a loopback engine with no address configured: the host the node advertises", () => {
    const raw = decodeConfigObject(
      { models: { m: { hf_repo: "org/m" } }, engine: { kv_offload: "nixl" } },
      undefined,
      {}
    )
    if (Result.isFailure(raw)) throw new Error(raw.failure.message)
    const config = raw.success
    // a peer on another host cannot dial 127.0.0.1: the advertised host (this host's external IPv4) instead
    expect(engineFor("vllm").render(config, { advertiseHost: "192.0.2.7" }).env.VLLM_NIXL_SIDE_CHANNEL_HOST).toBe(
      "192.0.2.7"
    )
    // an engine that listens on a routable address keeps it
    const routable = { ...config, engine: { ...config.engine, url: "http://10.1.1.1:8000" } }
    expect(engineFor("vllm").render(routable, { advertiseHost: "192.0.2.7" }).env.VLLM_NIXL_SIDE_CHANNEL_HOST).toBe(
      "10.1.1.1"
    )
  })

  it("the NIXL side-channel host: side_channel_host, else advertise_addr's host, else NODE_IP, else the engine host", () => {
    const host = (raw: Raw) => plan(raw).env.VLLM_NIXL_SIDE_CHANNEL_HOST
    // A DaemonSet's ConfigMap names no host: each node's own address comes from NODE_IP.
    const onNode = (raw: Raw, nodeIp: string) => {
      const r = decodeConfigObject({ models: { m: { hf_repo: "org/m" } }, ...raw }, undefined, { NODE_IP: nodeIp })
      if (Result.isFailure(r)) throw new Error(r.failure.message)
      return engineFor("vllm").render(r.success).env.VLLM_NIXL_SIDE_CHANNEL_HOST
    }
    expect(onNode({ engine: { kv_offload: "nixl" } }, "10.2.3.4")).toBe("10.2.3.4")
    expect(onNode({ engine: { kv_offload: "nixl" } }, " ")).toBe("127.0.0.1")
    expect(onNode({ engine: { kv_offload: "nixl" }, agent: { advertise_addr: "10.0.0.5:7071" } }, "10.2.3.4")).toBe(
      "10.0.0.5"
    )
    expect(onNode({ engine: { kv_offload: "nixl", side_channel_host: "10.9.9.9" } }, "10.2.3.4")).toBe("10.9.9.9")
    const base = { engine: { kv_offload: "nixl" }, agent: { role: "prefill", advertise_addr: "10.0.0.5:7071" } }
    expect(host(base)).toBe("10.0.0.5")
    expect(
      host({ ...base, engine: { kv_offload: "nixl", side_channel_host: "10.9.9.9", side_channel_port: 5601 } })
    ).toBe("10.9.9.9")
    expect(host({ ...base, agent: { role: "decode", advertise_addr: "[fd00::7]:7071" } })).toBe("fd00::7")
    expect(host({ engine: { kv_offload: "nixl", url: "http://10.1.1.1:8000" } })).toBe("10.1.1.1")
    expect(plan({ engine: { kv_offload: "nixl", side_channel_port: 5601 } }).env.VLLM_NIXL_SIDE_CHANNEL_PORT).toBe(
      "5601"
    )
  })

  it("SGLang's bootstrap port goes on the prefill side only", () => {
    const argv = plan({
      engine: { kind: "sglang", kv_offload: "nixl", bootstrap_port: 9001 },
      agent: { role: "prefill" }
    }).argv
    expect(argv.slice(-2)).toEqual(["--disaggregation-bootstrap-port", "9001"])
  })

  it("SGLang prefill on a loopback engine.url: a warning that decode engines on other hosts cannot reach its bootstrap server", () => {
    const warnings = (role: string, url?: string) =>
      plan({ engine: { kind: "sglang", kv_offload: "nixl", ...(url ? { url } : {}) }, agent: { role } }).warnings
    expect(warnings("prefill")).toEqual([
      expect.stringMatching(/bootstrap server \(port 8998\) to --host 127\.0\.0\.1/)
    ])
    expect(warnings("prefill", "http://localhost:8000")).toHaveLength(1)
    expect(warnings("prefill", "http://10.0.12.7:8000")).toBeUndefined()
    expect(warnings("decode")).toBeUndefined()
  })

  it("readiness: llama.cpp GET /health (newer builds answer /v1/models 200 while loading)", () => {
    const llama = (agent: Record<string, unknown>) =>
      plan({ engine: { kind: "llama_cpp" }, agent, models: { m: { hf_repo: "o/m" } } }).probe
    expect(llama({})).toEqual({ kind: "http", url: "http://127.0.0.1:8000/health" })
    expect(llama({ ready_probe_url: "http://127.0.0.1:8000/ready" })).toEqual({
      kind: "http",
      url: "http://127.0.0.1:8000/ready"
    })
  })

  it("readiness: GET /v1/models unless ready_probe_url; mlx sends a 1-token completion", () => {
    // A model list: a 200 listing a model still loading (`meta: null`) is not ready (probe.test.ts)
    expect(plan({}).probe).toEqual({ kind: "http", url: "http://127.0.0.1:8000/v1/models", modelList: "m" })
    for (const kind of ["openai_compat"]) {
      expect(plan({ engine: { kind }, models: { m: { hf_repo: "o/m" } } }).probe).toEqual({
        kind: "http",
        url: "http://127.0.0.1:8000/v1/models",
        modelList: "m"
      })
    }
    expect(plan({ agent: { ready_probe_url: "http://127.0.0.1:8000/health" } }).probe).toEqual({
      kind: "http",
      url: "http://127.0.0.1:8000/health"
    })
    const m = plan({
      engine: { kind: "mlx", url: "http://127.0.0.1:8080" },
      models: { m: { hf_repo: "mlx-community/x" } }
    })
    expect(m.probe).toEqual({
      kind: "completion",
      url: "http://127.0.0.1:8080/v1/completions",
      body: { model: "mlx-community/x", prompt: "ping", max_tokens: 1 }
    })
    expect([m.servedModel, m.requestModel]).toEqual(["m", "mlx-community/x"])
  })

  it("liveness: SGLang and vLLM on /health unless [engine].liveness_path (SGLang ready on /health too)", () => {
    const sgl = (engine: Record<string, unknown>, agent: Record<string, unknown> = {}) =>
      plan({ engine: { kind: "sglang", ...engine }, agent, models: { m: { hf_repo: "o/m" } } })
    const health = { kind: "http", url: "http://127.0.0.1:8000/health" }
    expect(sgl({})).toMatchObject({ probe: health, liveness: health })
    expect(sgl({ liveness_path: "/health_generate" })).toMatchObject({
      probe: health,
      liveness: { kind: "http", url: "http://127.0.0.1:8000/health_generate" }
    })
    const custom = { kind: "http", url: "http://127.0.0.1:8000/ready" }
    expect(sgl({}, { ready_probe_url: custom.url })).toMatchObject({ probe: custom, liveness: health })
    // vLLM: liveness on /health (503 once the engine core is dead; /v1/models stays 200 without it)
    expect(plan({})).toMatchObject({ probe: { url: "http://127.0.0.1:8000/v1/models" }, liveness: health })
    expect(plan({ engine: { liveness_path: "/ping" } }).liveness).toEqual({
      kind: "http",
      url: "http://127.0.0.1:8000/ping"
    })
    // Other engines keep liveness on the readiness probe unless the key is set.
    const llama = plan({ engine: { kind: "llama_cpp" }, models: { m: { path: "/m.gguf" } } })
    expect(llama.liveness).toEqual(llama.probe)
  })

  it("metrics: the engine's series names, none for mlx and openai_compat", () => {
    const names = (kind: string) => plan({ engine: { kind }, models: { m: { hf_repo: "o/m" } } }).metrics
    expect(names("vllm")).toEqual({
      url: "http://127.0.0.1:8000/metrics",
      names: {
        running: ["vllm:num_requests_running"],
        waiting: ["vllm:num_requests_waiting"],
        kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        progress: [
          "vllm:prompt_tokens_total",
          "vllm:generation_tokens_total",
          "vllm:prefix_cache_queries_total",
          "vllm:gpu_prefix_cache_queries_total"
        ],
        rankLabel: "engine"
      }
    })
    expect(names("sglang")?.names).toEqual({
      running: ["sglang:num_running_reqs"],
      waiting: ["sglang:num_queue_reqs"],
      kvUsage: ["sglang:token_usage"],
      progress: ["sglang:realtime_tokens_total"],
      rankLabel: "dp_rank"
    })
    expect(names("llama_cpp")?.names).toEqual({
      running: ["llamacpp:requests_processing"],
      waiting: ["llamacpp:requests_deferred"],
      kvUsage: [],
      progress: ["llamacpp:n_decode_total"]
    })
    expect(names("mlx")).toBeUndefined()
    expect(names("openai_compat")).toBeUndefined()
  })

  it("KV events: vLLM enables them, SGLang names the zmq publisher and a page size", () => {
    const kv = { events: true, events_endpoint: "tcp://127.0.0.1:5557", topic: "t", replay_endpoint: "tcp://*:5558" }
    const v = plan({ kv })
    expect(v.argv.slice(-4)).toEqual([
      "--kv-events-config",
      '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","topic":"t","replay_endpoint":"tcp://*:5558"}',
      "--block-size",
      "16"
    ])
    expect(v.kvEvents).toEqual({
      endpoint: "tcp://127.0.0.1:5557",
      engineBinds: false,
      replayEndpoint: "tcp://*:5558",
      topic: "t"
    })
    const s = plan({ engine: { kind: "sglang" }, kv: { events: true, block_size: 32 } })
    expect(s.argv.slice(-4)).toEqual([
      "--page-size",
      "32",
      "--kv-events-config",
      '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","topic":"kv-events"}'
    ])
    expect(s.kvEvents?.replayEndpoint).toBeUndefined()
    expect(plan({}).kvEvents).toBeUndefined()
    expect(plan({}).argv).not.toContain("--kv-events-config")
  })

  it("vLLM --block-size: with KV events on (so engine and KV bridge agree) or a non-default [kv].block_size", () => {
    const blockSize = (kv: Record<string, unknown>) => {
      const argv = plan({ kv }).argv
      const at = argv.indexOf("--block-size")
      return at < 0 ? undefined : argv[at + 1]
    }
    expect(blockSize({ events: true })).toBe("16")
    expect(blockSize({ events: true, block_size: 64 })).toBe("64")
    expect(blockSize({ block_size: 32 })).toBe("32")
    // Events off and the default: vLLM keeps its per-platform choice.
    expect(blockSize({})).toBeUndefined()
  })

  it.each([
    ["tcp://*:5557", true],
    ["tcp://[::]:5557", true],
    ["ipc:///run/cgn/kv.sock", true],
    ["inproc://kv", true],
    ["tcp://127.0.0.1:5557", false],
    ["tcp://10.0.0.5:5557", false]
  ])("engineBinds(%s) = %s", (endpoint, binds) => {
    expect(engineBinds(endpoint)).toBe(binds)
  })

  it("openai_compat spawns nothing", () => {
    const p = plan({
      engine: { kind: "openai_compat", url: "http://10.0.3.7:8000" },
      models: { m: { hf_repo: "o/m" } }
    })
    expect(p).toEqual({
      kind: "openai_compat",
      spawns: false,
      argv: [],
      env: {},
      baseUrl: "http://10.0.3.7:8000",
      host: "10.0.3.7",
      port: 8000,
      probe: { kind: "http", url: "http://10.0.3.7:8000/v1/models", modelList: "m" },
      liveness: { kind: "http", url: "http://10.0.3.7:8000/v1/models", modelList: "m" },
      metrics: undefined,
      kvEvents: undefined,
      servedModel: "m",
      requestModel: "m"
    })
  })
})

describe("redactPlan", () => {
  it("hides secret env values and the values of token flags, and nothing else", () => {
    const base = plan({
      engine: {
        env: {
          HF_TOKEN: "hf_x",
          OPENAI_API_KEY: "sk",
          DB_PASSWORD: "p",
          AWS_SECRET_ACCESS_KEY: "s",
          SSH_KEY: "k",
          WANDB_CRED: "w",
          TOKENIZERS_PARALLELISM: "false",
          UCX_TLS: "rc"
        }
      }
    })
    // written into the plan: the config refuses a key flag in engine.args (engineKeyChecks.ts)
    const p: LaunchPlan = {
      ...base,
      argv: [
        ...base.argv,
        "--api-key",
        "sk-1",
        "--hf-token=hf_y",
        "--token",
        "t",
        "--admin-api-key",
        "a",
        "-hft",
        "h",
        "--long-prefill-token-threshold",
        "8",
        "--port-offset",
        "1"
      ]
    }
    const r = redactPlan(p)
    expect(r.env).toEqual({
      HF_TOKEN: REDACTED,
      OPENAI_API_KEY: REDACTED,
      DB_PASSWORD: REDACTED,
      AWS_SECRET_ACCESS_KEY: REDACTED,
      SSH_KEY: REDACTED,
      WANDB_CRED: REDACTED,
      TOKENIZERS_PARALLELISM: "false",
      UCX_TLS: "rc"
    })
    expect(r.argv.slice(-13)).toEqual([
      "--api-key",
      REDACTED,
      `--hf-token=${REDACTED}`,
      "--token",
      REDACTED,
      "--admin-api-key",
      REDACTED,
      "-hft",
      REDACTED,
      "--long-prefill-token-threshold",
      "8",
      "--port-offset",
      "1"
    ])
    expect(p.env.HF_TOKEN).toBe("hf_x")
    expect(p.argv).toContain("sk-1")
  })
})

describe("render's text (formatPlan)", () => {
  const text = (raw: Raw) => formatPlan(plan({ models: { m: { hf_repo: "a/b" } }, ...raw }))

  it("a word with a single quote is one shell word still", () => {
    expect(shellQuote("it's")).toBe(`'it'\\''s'`)
  })

  it("mlx: a completion probe, the model forwarded under its repo id, no env added", () => {
    expect(text({ engine: { kind: "mlx" } })).toBe(
      [
        "engine:    mlx",
        "command:   mlx_lm.server --model a/b --host 127.0.0.1 --port 8000",
        "env:       (none added)",
        "base url:  http://127.0.0.1:8000",
        'probe:     POST http://127.0.0.1:8000/v1/completions {"model":"a/b","prompt":"ping","max_tokens":1} (a 1-token completion)',
        "metrics:   none",
        "kv events: off",
        "model:     m (forwarded as a/b)"
      ].join("\n")
    )
  })

  it("a proxied server: not spawned, no command", () => {
    expect(text({ engine: { kind: "openai_compat", url: "http://10.0.0.1:8000" } })).toContain(
      "engine:    openai_compat (not spawned: the agent proxies an existing server)\ncommand:   (none)\n"
    )
  })

  it("llama.cpp's metrics: no KV-cache usage gauge, said as '-'", () => {
    expect(text({ engine: { kind: "llama_cpp" }, models: { m: { path: "/m.gguf" } } })).toContain(
      "metrics:   http://127.0.0.1:8000/metrics (running llamacpp:requests_processing, waiting llamacpp:requests_deferred, kv usage -)"
    )
  })

  it("KV events: which side binds, and the replay endpoint", () => {
    expect(text({ kv: { events: true, events_endpoint: "tcp://*:5557", replay_endpoint: "tcp://*:5558" } })).toContain(
      'kv events: tcp://*:5557 (engine binds, topic "kv-events", replay tcp://*:5558)'
    )
    expect(text({ kv: { events: true } })).toContain(
      'kv events: tcp://127.0.0.1:5557 (engine connects, topic "kv-events")'
    )
  })
})

describe("planFor: the engine's GPUs from NVML's list (backends/index.ts)", () => {
  const gpuPlan = (raw: Raw, gpus: Parameters<typeof planFor>[1]) => Effect.runSync(planFor(config(raw), gpus))
  const idle = [0, 1, 2].map((index) => gpuWith({ index }))

  it("dp > 1: the automatic choice takes tp x dp GPUs (README models.<name>.gpus: the first tp x dp healthy GPUs)", () => {
    const p = gpuPlan({ models: { m: { hf_repo: "org/m", tp: 1, dp: 2 } } }, idle)
    expect(p.gpus).toEqual([0, 1])
    expect(p.env).toMatchObject({ CUDA_VISIBLE_DEVICES: "0,1", CUDA_DEVICE_ORDER: "PCI_BUS_ID" })
  })

  it("[engine].env stays last: an operator can still override CUDA_DEVICE_ORDER", () => {
    const p = gpuPlan(
      { engine: { env: { CUDA_DEVICE_ORDER: "FASTEST_FIRST" } }, models: { m: { hf_repo: "org/m" } } },
      idle
    )
    expect(p.env).toMatchObject({ CUDA_VISIBLE_DEVICES: "0", CUDA_DEVICE_ORDER: "FASTEST_FIRST" })
  })

  it("too few healthy GPUs: a faulty one fills in, and the plan's warnings say so", () => {
    const faulty = gpuWith({ index: 0, criticalXids: [{ xid: 79, events: 1 }] })
    const p = gpuPlan({ models: { m: { hf_repo: "org/m", tp: 2 } } }, [faulty, gpuWith({ index: 1 })])
    expect(p.gpus).toEqual([0, 1])
    expect(p.warnings).toEqual([
      'models."m".gpus: too few healthy GPUs; the automatic choice takes faulty ones (GPU 0 reported Xid 79 (fallen off the bus): it needs a GPU reset or a reboot): the engine is held, the node unhealthy, until they clear'
    ])
  })
})
