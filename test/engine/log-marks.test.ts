// What engine-log-levels.test.ts left open in each engine's level marks (layers/engine/backends/logMarks.ts), found
// by a mutation audit: uvicorn's TRACE level, the mark read at the line's start only (an engine's prefix, never text
// that quotes one further on), and vLLM's logger prefix told from text by its time, as llama.cpp's is.
import { describe, expect, it } from "vitest"
import { LLAMA_CPP_MARKS, MLX_MARKS, SGLANG_MARKS, VLLM_MARKS } from "../../src/layers/engine/backends/logMarks.ts"
import { lineLevelReader } from "../../src/services/engine/LineLevels.ts"

const vllm = lineLevelReader(VLLM_MARKS)
const sglang = lineLevelReader(SGLANG_MARKS)
const llama = lineLevelReader(LLAMA_CPP_MARKS)
const mlx = lineLevelReader(MLX_MARKS)

describe("uvicorn's TRACE (uvicorn/logging.py TRACE_LOG_LEVEL, `--log-level trace`) is logged at debug", () => {
  it("in vLLM's HTTP server's lines, with and without the process prefix, and in SGLang's", () => {
    expect(vllm("TRACE:    127.0.0.1:36840 - HTTP connection made")).toBe("debug")
    expect(vllm("(APIServer pid=1) TRACE:    127.0.0.1:36840 - ASGI [2] Started scope")).toBe("debug")
    expect(sglang("[2025-12-06 10:00:00] TRACE:    127.0.0.1:36840 - HTTP connection made")).toBe("debug")
  })
})

describe("the mark is the logger's prefix, at the line's start: text that quotes one further on is info", () => {
  it.each([
    ["llama.cpp", llama, "main: loading 0.00.009.554 E gguf_init_from_file: failed to open GGUF file"],
    ["vLLM (its logger's prefix)", vllm, "Traceback text INFO 12-06 10:00:00 [x.py:1] y"],
    ["vLLM (uvicorn's prefix)", vllm, "the engine said: ERROR: boom"],
    ["SGLang", sglang, "[2025-12-06 10:00:00 TP0] forwarded [2025-12-06 10:00:00] ERROR: x"],
    ["mlx-lm", mlx, "127.0.0.1 - - [06/Dec/2025 10:00:00] 2025-12-06 10:00:00,123 - ERROR - x"]
  ])("%s", (_engine, read, line) => {
    expect(read(line)).toBe("info")
  })
})

describe("vLLM's logger prefix carries its time (vllm/logger.py _FORMAT): a level's word without it is text", () => {
  it("a line that begins with DEBUG or WARNING and a word is info", () => {
    expect(vllm("DEBUG builds are slower")).toBe("info")
    expect(vllm("WARNING the model is large")).toBe("info")
  })
})
