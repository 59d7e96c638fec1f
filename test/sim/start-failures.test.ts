// --sim-crash-at-start CAUSE: the simulator, spawned on the command line the agent renders for its flavor, dies while
// loading as that engine does (the engine's lines, on its streams, and its exit: vLLM and llama-server exit 1, SGLang
// SIGKILLs its own process tree), and the backend's exit-hint table, over the last lines the agent keeps, names the
// config key that fixes it. A cause the flavor's engine does not die of is refused (exit 2). With --sim-strict-args
// a flag the simulator does not model is refused as the engine's parser refuses one it does not know.
import { spawnSync } from "node:child_process"
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import type { EngineKind } from "../../src/services/config/Config.ts"
import { matchHint } from "../../src/services/engine/ExitHints.ts"
import { simEntry } from "../support/sim.ts"

/** supervisorSettings.ts linesKept: what the agent has to match on. */
const LINES_KEPT = 50

const die = (kind: EngineKind, model: Record<string, unknown>, cause: string) =>
  dieWith(kind, model, ["--sim-crash-at-start", cause])

/** The simulator spawned on the command line the agent renders with `args` added, run to its exit. */
const dieWith = (kind: EngineKind, model: Record<string, unknown>, added: ReadonlyArray<string>) => {
  const flavor = kind
  const r = decodeConfigObject(
    {
      engine: {
        kind,
        command: [process.execPath, simEntry, "--flavor", flavor],
        args: added
      },
      models: { m: model }
    },
    undefined,
    { NODE_NAME: "n" }
  )
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  const plan = engineFor(kind).render(r.success)
  const [exe, ...args] = plan.argv
  const p = spawnSync(exe!, args, { encoding: "utf8", timeout: 20_000 })
  // vLLM writes its stdout lines first, then stderr's; the agent keeps them in arrival order, tagged.
  const tagged = (stream: string, text: string) =>
    text
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => `[${stream}] ${l}`)
  const lines = [...tagged("stdout", p.stdout), ...tagged("stderr", p.stderr)].slice(-LINES_KEPT)
  return { code: p.status, signal: p.signal, lines, hint: matchHint(plan.exitHints ?? [], lines) }
}

const HF = { hf_repo: "org/m", max_model_len: 8192 }
const GGUF = { path: "/no/such/model.gguf" }

describe("the simulator dies at start as its engine does, with a line the backend's table knows", () => {
  it.each<
    [EngineKind, string, Record<string, unknown>, { code: number | null; signal: string | null }, string, string]
  >([
    [
      "vllm",
      "kv-cache-memory",
      HF,
      { code: 1, signal: null },
      "No available memory for the cache blocks",
      'raise models."m".gpu_memory_utilization'
    ],
    [
      "vllm",
      "max-model-len",
      HF,
      { code: 1, signal: null },
      "the models's max seq len (8192)",
      'lower models."m".max_model_len'
    ],
    [
      "vllm",
      "cuda-oom",
      HF,
      { code: 1, signal: null },
      "torch.OutOfMemoryError: CUDA out of memory",
      'spread the weights over more GPUs (models."m".tp)'
    ],
    [
      "vllm",
      "gated-repo",
      HF,
      { code: 1, signal: null },
      "Cannot access gated repo for url https://huggingface.co/org/m/",
      'the Hugging Face Hub refused models."m".hf_repo'
    ],
    [
      "sglang",
      "kv-cache-memory",
      HF,
      { code: null, signal: "SIGKILL" },
      "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
      'raise models."m".gpu_memory_utilization'
    ],
    [
      "sglang",
      "cuda-oom",
      HF,
      { code: null, signal: "SIGKILL" },
      "torch.OutOfMemoryError: CUDA out of memory",
      'lower models."m".gpu_memory_utilization'
    ],
    [
      "sglang",
      "gated-repo",
      HF,
      { code: 1, signal: null },
      "OSError: You are trying to access a gated repo.",
      'the Hugging Face Hub refused models."m".hf_repo'
    ],
    [
      "llama_cpp",
      "model-file",
      GGUF,
      { code: 1, signal: null },
      "failed to open GGUF file '/no/such/model.gguf' (No such file or directory)",
      'the model file models."m".path names'
    ],
    [
      "llama_cpp",
      "cuda-oom",
      GGUF,
      { code: 1, signal: null },
      "cudaMalloc failed: out of memory",
      'lower models."m".max_model_len'
    ]
  ])("%s %s", (kind, cause, model, exit, upstream, hint) => {
    const d = die(kind, model, cause)
    expect({ code: d.code, signal: d.signal }, d.lines.join("\n")).toEqual(exit)
    expect(d.lines.some((l) => l.includes(upstream))).toBe(true)
    expect(d.hint).toContain(hint)
  })

  it.each<[EngineKind, Record<string, unknown>, string]>([
    ["mlx", { hf_repo: "org/m" }, "kv-cache-memory"],
    ["vllm", HF, "model-file"],
    ["llama_cpp", GGUF, "gated-repo"]
  ])("%s refuses --sim-crash-at-start (model %j) %s: exit 2", (kind, model, cause) => {
    const d = die(kind, model, cause)
    expect(d.code).toBe(2)
    expect(d.lines.join("\n")).toContain(`--sim-crash-at-start: ${cause}`)
  })
})

describe("--sim-strict-args: a flag it does not model is refused as the engine's parser refuses an unknown one", () => {
  it.each<[EngineKind, Record<string, unknown>, number, string]>([
    ["vllm", HF, 2, "vllm serve: error: unrecognized arguments: --bogus-flag"],
    ["sglang", HF, 2, "launch_server.py: error: unrecognized arguments: --bogus-flag"],
    ["mlx", { hf_repo: "org/m" }, 2, "mlx_lm.server: error: unrecognized arguments: --bogus-flag"],
    ["llama_cpp", GGUF, 1, "error: invalid argument: --bogus-flag"]
  ])("%s: its parser's exit and line, and the backend's hint names the args keys", (kind, model, code, last) => {
    const d = dieWith(kind, model, ["--sim-strict-args", "--bogus-flag"])
    expect({ code: d.code, last: d.lines.at(-1) }).toEqual({ code, last: `[stderr] ${last}` })
    expect(d.hint).toContain(
      'refused its command line (the line names the flag): remove or fix it in engine.args or models."m".args'
    )
  })
})
