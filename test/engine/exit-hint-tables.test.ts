// Each engine backend's exit-hint table (LaunchPlan.exitHints) against the lines the engines really print, as the
// agent keeps them ("[stream] line"). Every line below is the upstream text, from where it is written:
// - vLLM: vllm-project/vllm vllm/v1/core/kv_cache_utils.py (_check_enough_kv_cache_memory), vllm/worker/worker.py
//   (raise_if_cache_size_invalid, before V1), vllm/v1/worker/utils.py (request_memory),
//   vllm/transformers_utils/config.py (get_config), vllm/v1/engine/utils.py (wait_for_engine_startup);
// - SGLang: sgl-project/sglang python/sglang/srt/model_executor/pool_configurator.py (MemoryPoolConfig), its
//   model_runner.py before it, python/sglang/srt/entrypoints/engine.py (the sigquit handler);
// - torch: pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc);
// - the Hub: huggingface/huggingface_hub src/huggingface_hub/utils/_http.py (hf_raise_for_status),
//   huggingface/transformers src/transformers/utils/hub.py (cached_files);
// - llama.cpp: ggml-org/llama.cpp ggml/src/gguf.cpp, ggml/src/ggml-cuda/ggml-cuda.cu, tools/server/server.cpp, and
//   the lines the real llama-server of test/real printed for a missing and a non-GGUF model file.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import type { EngineKind } from "../../src/services/config/Config.ts"
import { matchHint } from "../../src/services/engine/ExitHints.ts"

const planOf = (kind: EngineKind, model: Record<string, unknown> = { hf_repo: "org/m" }, name = "llama-3") => {
  const r = decodeConfigObject({ engine: { kind }, models: { [name]: model } }, undefined, { NODE_NAME: "n" })
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return engineFor(kind).render(r.success)
}
const hintFor = (kind: EngineKind, line: string, model?: Record<string, unknown>) =>
  matchHint(planOf(kind, model).exitHints ?? [], [line])

const GMU = 'models."llama-3".gpu_memory_utilization'
const LEN = 'models."llama-3".max_model_len'
const TP = 'models."llama-3".tp'
const REPO = 'models."llama-3".hf_repo'

const TORCH_OOM =
  "[stderr] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total capacity of " +
  "79.19 GiB of which 101.06 MiB is free. "
const HUB = [
  "[stderr] Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json.",
  "[stderr] Repository Not Found for url: https://huggingface.co/api/models/org/nope/revision/main.",
  "[stderr] OSError: You are trying to access a gated repo.",
  "[stderr] OSError: org/nope is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'"
]

describe("vLLM", () => {
  it.each<[string, ReadonlyArray<string>]>([
    [
      `raise ${GMU}`,
      [
        "[stdout] (EngineCore_DP0 pid=3709) ERROR 09-18 21:38:02 [core.py:708] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        "[stderr] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
      ]
    ],
    [
      `lower ${LEN}`,
      [
        "[stderr] (EngineCore_DP0 pid=3709) ValueError: To serve at least one request with the models's max seq len (262144), (24.00 GiB KV cache is needed, which is larger than the available KV cache memory (8.68 GiB). Based on the available memory, the estimated maximum model length is 94784. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        "[stderr] ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (34480). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
      ]
    ],
    [
      "the GPUs have less free memory",
      [
        "[stderr] ValueError: Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU memory utilization (0.8, 12.39 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
      ]
    ],
    [`spread the weights over more GPUs (${TP})`, [TORCH_OOM]],
    [
      `the Hugging Face Hub refused ${REPO}`,
      ["[stderr] (APIServer pid=1) ValueError: Invalid repository ID or local directory specified: 'org/nope'.", ...HUB]
    ]
  ])("%s", (want, lines) => {
    for (const line of lines) expect(hintFor("vllm", line), line).toContain(want)
  })

  it("names the value the config sets", () => {
    const line = "[stderr] ValueError: No available memory for the cache blocks. Try increasing"
    expect(hintFor("vllm", line, { hf_repo: "o/m", gpu_memory_utilization: 0.5 })).toContain(`${GMU} (now 0.5)`)
  })

  it("a local path: the hint names models.x.path", () => {
    const line = "[stderr] ValueError: Invalid repository ID or local directory specified: '/models/m'."
    expect(hintFor("vllm", line, { path: "/models/m" })).toContain('models."llama-3".path is not a model directory')
  })
})

describe("SGLang", () => {
  it.each<[string, ReadonlyArray<string>]>([
    [
      `raise ${GMU}`,
      [
        "[stderr] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "[stderr] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.8"
      ]
    ],
    [`lower ${GMU}`, [TORCH_OOM]],
    [`the Hugging Face Hub refused ${REPO}`, HUB]
  ])("%s", (want, lines) => {
    for (const line of lines) expect(hintFor("sglang", line), line).toContain(want)
  })
})

describe("llama.cpp", () => {
  const GGUF = { path: "/models/m.gguf" }
  it.each<[string, ReadonlyArray<string>]>([
    [
      'the model file models."llama-3".path names',
      [
        "[stderr] 0.00.028.372 E gguf_init_from_file: failed to open GGUF file '/tmp/x.gguf' (No such file or directory)",
        "[stderr] gguf_init_from_file: failed to open GGUF file '/models/m.gguf'",
        "[stderr] 0.00.004.462 E gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'"
      ]
    ],
    [
      `lower ${LEN}`,
      [
        "[stderr] ggml_backend_cuda_buffer_type_alloc_buffer: allocating 279356.51 MiB on device 0: cudaMalloc failed: out of memory"
      ]
    ]
  ])("%s", (want, lines) => {
    for (const line of lines) expect(hintFor("llama_cpp", line, GGUF), line).toContain(want)
  })
})

describe("a command line the engine refuses: its parser's last line", () => {
  const ARGS = 'models."llama-3".args'
  it.each<[EngineKind, string, ReadonlyArray<string>]>([
    [
      "vllm",
      "vLLM",
      [
        "[stderr] vllm serve: error: unrecognized arguments: --bogus-flag 3",
        "[stderr] vllm serve: error: argument --dtype: invalid choice: 'f8' (choose from 'auto', 'half', 'float16')"
      ]
    ],
    [
      "sglang",
      "SGLang",
      [
        "[stderr] launch_server.py: error: unrecognized arguments: --bogus-flag",
        "[stderr] launch_server.py: error: argument --tp-size: invalid int value: 'two'",
        // argparse's line for a required flag the args override dropped
        "[stderr] launch_server.py: error: the following arguments are required: --model-path"
      ]
    ],
    ["mlx", "mlx-lm", ["[stderr] mlx_lm.server: error: unrecognized arguments: --bogus-flag"]],
    [
      "llama_cpp",
      "llama-server",
      [
        "[stderr] error: invalid argument: --bogus-flag",
        '[stderr] error while handling argument "-c": stoi',
        '[stderr] error while handling environment variable "LLAMA_ARG_CTX_SIZE": stoi'
      ]
    ]
  ])("%s", (kind, engine, lines) => {
    const model = kind === "llama_cpp" ? { path: "/m.gguf" } : undefined
    for (const line of lines) {
      const hint = matchHint(planOf(kind, model).exitHints ?? [], [line])
      expect(hint, line).toContain(`${engine} refused its command line`)
      expect(hint).toContain(`engine.args or ${ARGS}`)
    }
  })
})

describe("lines that name no cause the config fixes match nothing", () => {
  it.each<EngineKind>(["vllm", "sglang", "llama_cpp"])("%s", (kind) => {
    for (const line of [
      "[stderr] (APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
      "[stdout] INFO 07-11 06:18:32 [kv_cache_utils.py:646] GPU KV cache size: 114,432 tokens",
      "[stdout] INFO 07-11 06:18:32 [gpu_worker.py:276] Available KV cache memory: 61.23 GiB",
      "[stdout] INFO 07-11 06:18:32 [kv_cache_utils.py:649] Maximum concurrency for 18,000 tokens per request: 6.36x",
      "[stderr] [2025-09-18 21:38:03] Received sigquit from a child process. It usually means the child failed.",
      "[stderr] [2025-09-18 21:38:02] KV Cache is allocated. #tokens: 6247850, K size: 71.50 GB, V size: 71.50 GB",
      "[stderr] 0.00.030.435 E srv  llama_server: exiting due to model loading error",
      "[stderr] 0.00.029.674 E llama_model_load_from_file_impl: failed to load model",
      "[stderr] llama_kv_cache_init:      CUDA0 KV buffer size =   379.23 MiB"
    ])
      expect(
        matchHint(planOf(kind, kind === "llama_cpp" ? { path: "/m.gguf" } : undefined).exitHints ?? [], [line]),
        line
      ).toBeUndefined()
  })

  it("openai_compat has no table (it starts nothing)", () => {
    expect(planOf("openai_compat").exitHints).toBeUndefined()
  })
})
