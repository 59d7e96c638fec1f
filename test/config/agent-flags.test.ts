// engine.args and models.x.args that set again a flag the agent renders from the config and relies on
// (services/engine/AgentFlags.ts, layers/config/agentFlagChecks.ts, each backend's capabilities.agentFlags): refused,
// exit 2 through the config's problems, naming the key to set instead. A CLI review: `--port` in engine.args passed
// `check` and left the agent waiting on a port the engine never opened, until engine.startup_timeout (30 minutes).
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { agentFlagSetBy } from "../../src/services/engine/AgentFlags.ts"

type Raw = Record<string, Record<string, unknown>>

const problems = (raw: Raw): ReadonlyArray<string> => {
  const r = decodeConfigObject({ models: { m: { hf_repo: "org/m" } }, ...raw }, undefined, { NODE_NAME: "n" })
  return Result.isFailure(r) ? r.failure.problems : []
}

const listen = (path: string, flags: string, engine: string) =>
  `${path}: ${flags} is set by the agent from engine.url, and ${engine} keeps the last value given, so this one would win: the engine would listen where the agent does not look for it; set engine.url instead`

describe("engine.args setting a flag the agent renders", () => {
  it("vLLM: --host/--port, --served-model-name, -tp and -dp in every spelling are refused; other flags pass", () => {
    expect(problems({ engine: { args: ["--port", "48555"] } })).toEqual([listen("engine.args", "--port", "vLLM")])
    expect(problems({ engine: { args: ["--host=0.0.0.0", "--port=1"] } })).toEqual([
      listen("engine.args", "--host, --port", "vLLM")
    ])
    expect(problems({ engine: { args: ["-tp", "4", "--served_model_name", "x", "--data-parallel-size=2"] } })).toEqual([
      'engine.args: --served-model-name is set by the agent from models."m".served_name, and vLLM keeps the last value given, so this one would win: the agent\'s calls would name a model the engine does not serve (each answered 404); set models."m".served_name instead',
      'engine.args: -tp is set by the agent from models."m".tp, and vLLM keeps the last value given, so this one would win: the agent chose the engine\'s GPUs (CUDA_VISIBLE_DEVICES) for the config\'s parallelism; set models."m".tp instead',
      'engine.args: --data-parallel-size is set by the agent from models."m".dp, and vLLM keeps the last value given, so this one would win: the agent chose the engine\'s GPUs (CUDA_VISIBLE_DEVICES), and reads its ranks (KV events, test completions), for the config\'s parallelism; set models."m".dp instead'
    ])
    // what the agent renders only as a default, or reads back, stays the operator's to set
    expect(
      problems({
        engine: {
          args: ["--max-model-len", "8192", "--data-parallel-size-local", "1", "--kv-transfer-config", "{}", "-pp", "2"]
        }
      })
    ).toEqual([])
  })

  it("SGLang's spellings and abbreviations (argparse), in models.x.args too", () => {
    expect(
      problems({
        engine: { kind: "sglang" },
        models: { "a.b": { hf_repo: "org/m", args: ["--tp", "2", "--dp-size", "2"] } }
      })
    ).toEqual([
      'models."a.b".args: --tp-size is set by the agent from models."a.b".tp, and SGLang keeps the last value given, so this one would win: the agent chose the engine\'s GPUs (CUDA_VISIBLE_DEVICES) for the config\'s parallelism; set models."a.b".tp instead',
      'models."a.b".args: --dp-size is set by the agent from models."a.b".dp, and SGLang keeps the last value given, so this one would win: the agent chose the engine\'s GPUs (CUDA_VISIBLE_DEVICES), and reads its ranks (KV events, test completions), for the config\'s parallelism; set models."a.b".dp instead'
    ])
  })

  it("llama-server's -a/--alias and mlx-lm's --port; openai_compat takes no args at all", () => {
    const llama = { kind: "llama_cpp" }
    const gguf = { m: { path: "/m.gguf" } }
    expect(problems({ engine: { ...llama, args: ["-a", "x"] }, models: gguf })).toEqual([
      'engine.args: -a is set by the agent from models."m".served_name, and llama-server keeps the last value given, so this one would win: the agent\'s calls would name a model the engine does not serve (each answered 404); set models."m".served_name instead'
    ])
    expect(problems({ engine: { ...llama, args: ["--alias=x", "-np", "4"] }, models: gguf })).toHaveLength(1)
    expect(problems({ engine: { kind: "mlx", args: ["--port", "9"] } })).toEqual([
      listen("engine.args", "--port", "mlx-lm")
    ])
    expect(problems({ engine: { kind: "openai_compat", url: "http://10.0.0.1:8000", args: ["--port", "9"] } })).toEqual(
      ["engine.args: openai_compat proxies engine.url and starts nothing; remove engine.args"]
    )
  })
})

describe("agentFlagSetBy", () => {
  it("reads long flags as the parsers do and short ones as written", () => {
    const flags = ["--tensor-parallel-size", "-tp"]
    expect(
      ["--tensor-parallel-size", "--tensor_parallel_size=2", "--tensor-par", "-tp", "-tp=2"].map((a) =>
        agentFlagSetBy(a, flags)
      )
    ).toEqual(["--tensor-parallel-size", "--tensor-parallel-size", "--tensor-parallel-size", "-tp", "-tp"])
    expect(["-t", "tp", "-tpx", "--tp", "4"].map((a) => agentFlagSetBy(a, flags))).toEqual([
      undefined,
      undefined,
      undefined,
      undefined,
      undefined
    ])
  })
})
