// Pure parts of the simulator: command-line parsing per flavor, durations, block hashing, token plans.
import { describe, expect, it } from "vitest"
import { parseArgs } from "../../src/sim/args.ts"
import { parseDuration } from "../../src/sim/commandLine.ts"
import { KvBlocks } from "../../src/sim/kvblocks.ts"
import { shouldBind } from "../../src/sim/kvpublisher.ts"
import { plan, prng } from "../../src/sim/tokens.ts"

describe("parseArgs", () => {
  it.each([
    [["serve", "org/m", "--served-model-name", "s", "--port", "9"], "vllm", "s", 9],
    [["--model-path", "org/m", "--tp-size", "2"], "sglang", "org/m", 30000],
    [["-m", "sglang.launch_server", "--model-path", "org/m"], "sglang", "org/m", 30000],
    [["-m", "/x/file.gguf", "-np", "2"], "llama_cpp", "file.gguf", 8080],
    [["-hf", "org/repo", "-a", "al"], "llama_cpp", "al", 8080],
    [["--model", "mlx/m"], "mlx", "mlx/m", 8080],
    [["--flavor", "mlx", "--model", "x"], "mlx", "x", 8080]
  ])("%j -> %s", (argv, flavor, served, port) => {
    const c = parseArgs(argv)
    expect(c).toMatchObject({ flavor, servedName: served, port })
  })

  it("llama_cpp: a slot's context is -c / -np, the whole -c with --kv-unified (llama-context.cpp n_ctx_seq)", () => {
    const base = ["-m", "/x/file.gguf", "-c", "1024", "-np", "2"]
    expect(parseArgs(base).slotContext).toBe(512)
    expect(parseArgs([...base, "--kv-unified"]).slotContext).toBe(1024)
    expect(parseArgs([...base, "-kvu"]).slotContext).toBe(1024)
  })

  it("reads JSON and dotted config flags, knobs and unmodelled flags", () => {
    const c = parseArgs([
      "serve",
      "m",
      "--kv-events-config",
      '{"enable_kv_cache_events":true}',
      "--kv-transfer-config.kv_connector",
      "NixlConnector",
      "--kv-transfer-config.kv_connector_extra_config.backends+",
      "UCX",
      "--sim-ttft",
      "2s",
      "--sim-ignore-sigterm",
      "--enforce-eager",
      "--weird",
      "1"
    ])
    expect(c.kvEventsConfig).toEqual({ enable_kv_cache_events: true })
    expect(c.kvTransferConfig).toEqual({
      kv_connector: "NixlConnector",
      kv_connector_extra_config: { backends: ["UCX"] }
    })
    expect(c).toMatchObject({ ttftMs: 2000, ignoreSigterm: true })
    expect(c.unmodelled).toEqual(["--weird", "--enforce-eager"])
  })

  it("takes a request's default length from mlx-lm's --max-tokens (512), 16 elsewhere, --sim-default-max-tokens over both", () => {
    expect(parseArgs(["--model", "mlx/m"]).defaultMaxTokens).toBe(512)
    expect(parseArgs(["--model", "mlx/m", "--max-tokens", "40"])).toMatchObject({
      defaultMaxTokens: 40,
      unmodelled: []
    })
    expect(
      parseArgs(["--model", "mlx/m", "--max-tokens", "40", "--sim-default-max-tokens", "7"]).defaultMaxTokens
    ).toBe(7)
    expect(parseArgs(["serve", "m"]).defaultMaxTokens).toBe(16)
  })

  it("parses durations", () => {
    expect([parseDuration("0ms"), parseDuration("50ms"), parseDuration("1.5s"), parseDuration("2m")]).toEqual([
      0, 50, 1500, 120000
    ])
    expect(() => parseDuration("soon")).toThrow()
  })
})

describe("KvBlocks", () => {
  it("chains hashes, hits the prefix cache and evicts unpinned blocks", () => {
    const kv = new KvBlocks(2, 3, 42n)
    const a = kv.admit([1, 2, 3, 4])
    expect(a.events).toHaveLength(1)
    kv.release(a.hashes)
    const b = kv.admit([1, 2, 3, 4, 5, 6])
    expect(b.hitTokens).toBe(4)
    expect(b.events[0]).toMatchObject({ type: "BlockStored", parentBlockHash: a.hashes[1], tokenIds: [5, 6] })
    kv.release(b.hashes)
    const c = kv.admit([9, 9, 8, 8])
    expect(c.events.at(-1)).toMatchObject({ type: "BlockRemoved" })
    expect(kv.cachedBlocks).toBe(3)
  })
})

describe("misc", () => {
  it("applies vLLM's bind/connect rule", () => {
    expect([shouldBind("tcp://*:5557"), shouldBind("tcp://127.0.0.1:5557"), shouldBind("ipc:///tmp/x")]).toEqual([
      true,
      false,
      true
    ])
  })
  it("binds 0.0.0.0 as newest SGLang does, connects to it as vLLM does", () => {
    expect([shouldBind("tcp://0.0.0.0:5557", "sglang"), shouldBind("tcp://0.0.0.0:5557", "vllm")]).toEqual([
      true,
      false
    ])
  })
  it("plans echo and random generations", () => {
    expect(plan("echo", ["a", "b"], 5, prng(1))).toEqual({ tokens: ["a", " b"], finishReason: "stop" })
    expect(plan("echo", ["a", "b"], 1, prng(1)).finishReason).toBe("length")
    const r = plan("random", [], 4, prng(9))
    expect(r.tokens).toHaveLength(4)
    expect(r).toEqual(plan("random", [], 4, prng(9)))
  })
})
