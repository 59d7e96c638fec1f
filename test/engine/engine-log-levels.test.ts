// Each engine line is logged at the level the engine marked it with (a chaos soak with the real llama-server: all of
// its W and E lines were logged at info, so log_level = "warn" hid them with the per-request chatter). The marks are
// backend data (layers/engine/backends/logMarks.ts): each engine's own lines as it prints them are read here, and a
// run of the llama_cpp plan logs the real llama-server's lines (captured from v0.4.0) at their levels.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Deferred, Effect, Layer, Logger, References } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { spawnRun } from "../../src/layers/engine/run.ts"
import { guardEntry } from "../../src/programs/programPaths.ts"
import { EngineKinds } from "../../src/services/config/ConfigSchema.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { lineLevelReader } from "../../src/services/engine/LineLevels.ts"

const cleanups: Array<() => void> = []
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c()
})

const planOf = (kind: string): LaunchPlan => {
  const model = kind === "llama_cpp" ? { path: "/m.gguf" } : { hf_repo: "org/m" }
  const raw = { engine: { kind, url: "http://127.0.0.1:8000" }, models: { m: model } }
  const r = decodeConfigObject(raw, undefined, { NODE_NAME: "n" })
  if (r._tag === "Failure") throw new Error(r.failure.message)
  return engineFor(r.success.engine.kind).render(r.success)
}
const levelsOf = (kind: string, lines: ReadonlyArray<string>) => lines.map(lineLevelReader(planOf(kind).logLevels))

/** llama-server v0.4.0's own lines (common/log.cpp's prefix: time since start, level letter), as it printed them. */
const LLAMA_LINES = [
  "0.00.010.703 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)",
  "0.00.011.237 W srv  llama_server: CORS is set to allow all origins ('*') and no API key is set",
  "0.00.400.344 I slot print_timing: id  1 | task 0 | prompt eval time =       2.52 ms /     2 tokens",
  "0.00.009.554 E gguf_init_from_file: failed to open GGUF file '/tmp/nope.gguf' (No such file or directory)",
  "1.02.003.004 D srv  update_slots: run slots completed"
]

describe("an engine line's level, read by its backend's marks", () => {
  it("llama.cpp: the letter after the timestamp; colours taken out; a line without the timestamp is info", () => {
    expect(levelsOf("llama_cpp", LLAMA_LINES)).toEqual(["info", "warn", "info", "error", "debug"])
    expect(
      levelsOf("llama_cpp", [
        // --log-colors on (common/log.cpp: the timestamp blue, W magenta)
        "\x1b[34m0.00.011.237\x1b[0m \x1b[35mW srv  llama_server: CORS is set to allow all origins",
        // --no-log-timestamps, and a continuation line: not told from text
        "W srv  llama_server: CORS is set to allow all origins",
        "E = mc^2",
        "........................................"
      ])
    ).toEqual(["warn", "info", "info", "info"])
  })

  it("vLLM: its logger's level name, after a process's prefix (coloured or not), and uvicorn's `LEVEL:`", () => {
    expect(
      levelsOf("vllm", [
        "INFO 12-06 10:00:00 [api_server.py:1857] vLLM API server version 0.11.0",
        "(APIServer pid=1) WARNING 12-06 10:00:00 [arg_utils.py:1234] The model has a long context length.",
        "(EngineCore_DP0 pid=262) ERROR 12-06 10:00:01 [core.py:708] EngineCore failed to start.",
        "\x1b[1;36m(EngineCore_DP0 pid=262)\x1b[0;0m CRITICAL 12-06 10:00:01 [core.py:1] dead",
        "DEBUG 12-06 10:00:00 [utils.py:1] debug text",
        '(APIServer pid=1) INFO:     127.0.0.1:36840 - "GET /health HTTP/1.1" 200 OK',
        "(APIServer pid=1) WARNING:  Invalid HTTP request received.",
        // an uncaught traceback (stderr, no level), a progress bar
        "(EngineCore_DP0 pid=262) Traceback (most recent call last):",
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.2s/it]"
      ])
    ).toEqual(["info", "warn", "error", "error", "debug", "info", "warn", "info", "info"])
  })

  it("SGLang: its own lines carry no level (info); its HTTP server's carry uvicorn's", () => {
    expect(
      levelsOf("sglang", [
        "[2025-12-06 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16",
        "[2025-12-06 10:00:00] INFO:     Started server process [1234]",
        "[2025-12-06 10:00:00] WARNING:  Invalid HTTP request received.",
        "[2025-12-06 10:00:00] ERROR:    Exception in ASGI application"
      ])
    ).toEqual(["info", "info", "warn", "error"])
  })

  it("mlx-lm: logging.basicConfig's `time - LEVEL - message`; its request lines are info", () => {
    expect(
      levelsOf("mlx", [
        "2025-12-06 10:00:00,123 - INFO - Starting httpd at 127.0.0.1 on port 8080...",
        "2025-12-06 10:00:00,123 - WARNING - mlx_lm.server is not recommended for production",
        "2025-12-06 10:00:00,123 - ERROR - boom",
        '127.0.0.1 - - [06/Dec/2025 10:00:00] "POST /v1/completions HTTP/1.1" 200 -'
      ])
    ).toEqual(["info", "warn", "error", "info"])
  })

  it("every engine the agent spawns has marks; a proxied server's lines are not the agent's to read", () => {
    for (const kind of EngineKinds) expect(planOf(kind).logLevels !== undefined, kind).toBe(kind !== "openai_compat")
    expect(levelsOf("openai_compat", LLAMA_LINES)).toEqual(Array(LLAMA_LINES.length).fill("info"))
  })
})

describe("an engine run's lines in the agent's log", () => {
  it("are logged at the engine's level (llama_cpp's plan, the real server's lines), scrubbed as before", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-levels-"))
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
    const engine = path.join(dir, "engine.mjs")
    const secret = "sk-level-secret-123456"
    const lines = [...LLAMA_LINES, `0.00.011.300 W srv  key ${secret} seen`]
    fs.writeFileSync(engine, `process.stderr.write(${JSON.stringify(`${lines.join("\n")}\n`)})\n`)
    const plan: LaunchPlan = {
      ...planOf("llama_cpp"),
      argv: [process.execPath, engine],
      env: { LLAMA_API_KEY: secret }
    }
    const logged: Array<readonly [string, string]> = []
    const logger = Logger.make(({ logLevel, message }) => {
      for (const m of [message].flat()) if (typeof m === "string" && /^\d/.test(m)) logged.push([logLevel, m])
    })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const run = yield* spawnRun(guardEntry())(plan, { run: 0, graceMs: 200, linesKept: 10 })
          yield* Deferred.await(run.exited)
          yield* run.drainOutput(5_000)
        })
        // the agent's logger filters by its own threshold: every level reaches it (Logging.ts)
      ).pipe(Effect.provide(Layer.mergeAll(Logger.layer([logger]), Layer.succeed(References.MinimumLogLevel, "Trace"))))
    )
    expect(logged.map(([level]) => level)).toEqual(["Info", "Warn", "Info", "Error", "Debug", "Warn"])
    expect(logged.map(([, m]) => m).slice(0, 5)).toEqual(LLAMA_LINES)
    expect(logged.at(-1)?.[1]).not.toContain(secret)
  }, 30_000)
})
