// --sim-crash-at-start CAUSE: the simulator dies while loading, the way its flavor's engine dies of a configuration
// mistake, printing the engine's own lines (the message texts copied from upstream, the frames around the cause
// shortened, what follows it at full length: vLLM's API-server traceback) on the stream the engine prints them on,
// and ending with the engine's own exit. Pure: the lines and the
// exit are data; src/programs/sim.ts writes them.
import type { Flavor } from "./simConfig.ts"

export type StartFailure = "kv-cache-memory" | "max-model-len" | "cuda-oom" | "gated-repo" | "model-file"

export interface StartDeath {
  readonly lines: ReadonlyArray<{ readonly stream: "stdout" | "stderr"; readonly text: string }>
  /** vLLM, llama-server: an uncaught error, exit 1; SGLang: it SIGKILLs its own process tree. */
  readonly exit: { readonly code: number } | { readonly signal: "SIGKILL" }
}

interface Ctx {
  readonly model: string
  readonly maxModelLen: number | undefined
  readonly pid: number
  readonly now: Date
  /** llama_cpp: whether --fit is on (its loader's lines then come twice: llamaLoadDeath). */
  readonly fit?: boolean | undefined
}

const pad = (n: number) => String(n).padStart(2, "0")
const ymd = (d: Date) => `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`
const hms = (d: Date) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`

const out = (text: string) => ({ stream: "stdout" as const, text })
const err = (text: string) => ({ stream: "stderr" as const, text })

/** torch.OutOfMemoryError's text (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc). */
const TORCH_OOM =
  "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total capacity of 79.19 GiB " +
  "of which 101.06 MiB is free. Of the allocated memory 78.32 GiB is allocated by PyTorch, and 145.20 MiB is reserved " +
  "by PyTorch but unallocated."

/**
 * huggingface_hub's GatedRepoError message (src/huggingface_hub/utils/_http.py, hf_raise_for_status), with the Hub's
 * own words after it; a traceback prints it after the class name.
 */
const gatedRepo = (model: string): ReadonlyArray<string> => [
  "401 Client Error. (Request ID: Root=1-68cc2a1b-5e0f7c2d3a4b)",
  "",
  `Cannot access gated repo for url https://huggingface.co/${model}/resolve/main/config.json.`,
  `Access to model ${model} is restricted. You must have access to it and be authenticated to access it. Please log in.`
]

const gatedRepoError = (model: string): ReadonlyArray<string> => {
  const [first = "", ...rest] = gatedRepo(model)
  return [`huggingface_hub.errors.GatedRepoError: ${first}`, ...rest]
}

const VLLM_PY = "/usr/local/lib/python3.12/dist-packages/vllm"
const frame = (file: string, line: number, fn: string, code: string) => [
  `  File "${file}", line ${line}, in ${fn}`,
  `    ${code}`
]
/**
 * The API server's own traceback after its EngineCore died, at full length as vLLM prints it (the call chain from
 * `vllm serve` through uvloop, asyncio and the engine client's start to vllm/v1/engine/utils.py
 * wait_for_engine_startup): ~40 lines after the cause, which is what the agent's kept lines must survive.
 */
const API_SERVER_TRACEBACK: ReadonlyArray<string> = [
  "Traceback (most recent call last):",
  ...frame("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
  ...frame(`${VLLM_PY}/entrypoints/cli/main.py`, 73, "main", "args.dispatch_function(args)"),
  ...frame(`${VLLM_PY}/entrypoints/cli/serve.py`, 59, "cmd", "uvloop.run(run_server(args))"),
  ...frame("/usr/local/lib/python3.12/dist-packages/uvloop/__init__.py", 109, "run", "return __asyncio.run("),
  ...frame("/usr/lib/python3.12/asyncio/runners.py", 195, "run", "return runner.run(main)"),
  ...frame("/usr/lib/python3.12/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
  '  File "uvloop/loop.pyx", line 1518, in uvloop.loop.Loop.run_until_complete',
  ...frame("/usr/local/lib/python3.12/dist-packages/uvloop/__init__.py", 61, "wrapper", "return await main"),
  ...frame(
    `${VLLM_PY}/entrypoints/openai/api_server.py`,
    1884,
    "run_server",
    "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"
  ),
  ...frame(
    `${VLLM_PY}/entrypoints/openai/api_server.py`,
    1902,
    "run_server_worker",
    "async with build_async_engine_client("
  ),
  ...frame("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
  ...frame(
    `${VLLM_PY}/entrypoints/openai/api_server.py`,
    180,
    "build_async_engine_client",
    "async with build_async_engine_client_from_engine_args("
  ),
  ...frame("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
  ...frame(
    `${VLLM_PY}/entrypoints/openai/api_server.py`,
    225,
    "build_async_engine_client_from_engine_args",
    "async_llm = AsyncLLM.from_vllm_config("
  ),
  ...frame(`${VLLM_PY}/utils/__init__.py`, 1572, "inner", "return fn(*args, **kwargs)"),
  ...frame(`${VLLM_PY}/v1/engine/async_llm.py`, 207, "from_vllm_config", "return cls("),
  ...frame(
    `${VLLM_PY}/v1/engine/async_llm.py`,
    134,
    "__init__",
    "self.engine_core = EngineCoreClient.make_async_mp_client("
  ),
  ...frame(`${VLLM_PY}/v1/engine/core_client.py`, 102, "make_async_mp_client", "return AsyncMPClient(*client_args)"),
  ...frame(`${VLLM_PY}/v1/engine/core_client.py`, 769, "__init__", "super().__init__("),
  ...frame(
    `${VLLM_PY}/v1/engine/core_client.py`,
    448,
    "__init__",
    "with launch_core_engines(vllm_config, executor_class,"
  ),
  ...frame("/usr/lib/python3.12/contextlib.py", 144, "__exit__", "next(self.gen)"),
  ...frame(`${VLLM_PY}/v1/engine/utils.py`, 729, "launch_core_engines", "wait_for_engine_startup("),
  ...frame(`${VLLM_PY}/v1/engine/utils.py`, 1010, "wait_for_engine_startup", "raise RuntimeError("),
  "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
]

/** The Hub's refusal raised in huggingface_hub and chained into the engine's own exception, up to that traceback. */
const hubRefusalChain = (model: string): ReadonlyArray<string> => [
  "Traceback (most recent call last):",
  '  File "/usr/local/lib/python3.12/dist-packages/huggingface_hub/utils/_http.py", line 409, in hf_raise_for_status',
  "    response.raise_for_status()",
  ...gatedRepoError(model),
  "",
  "The above exception was the direct cause of the following exception:",
  "",
  "Traceback (most recent call last):"
]

// vLLM: the EngineCore process logs its exception through vLLM's logger (stdout, vllm/logger.py) and dies of it
// (its traceback on stderr); the API server then raises "Engine core initialization failed" (vllm/v1/engine/utils.py,
// wait_for_engine_startup) and exits 1. Lines carry the process prefix vLLM puts on each process's output.
const vllmCoreDeath = (c: Ctx, frames: ReadonlyArray<string>, error: string): StartDeath => {
  const core = `(EngineCore_DP0 pid=${c.pid + 1})`
  const api = `(APIServer pid=${c.pid})`
  const at = `${pad(c.now.getMonth() + 1)}-${pad(c.now.getDate())} ${hms(c.now)}`
  const tb = ["Traceback (most recent call last):", ...frames, error]
  return {
    lines: [
      ...["EngineCore failed to start.", ...tb].map((l) => out(`${core} ERROR ${at} [core.py:708] ${l}`)),
      ...[`Process EngineCore_DP0:`, ...tb].map((l) => err(`${core} ${l}`)),
      ...API_SERVER_TRACEBACK.map((l) => err(`${api} ${l}`))
    ],
    exit: { code: 1 }
  }
}

const KV_UTILS = '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 686'

const vllm: Partial<Record<StartFailure, (c: Ctx) => StartDeath>> = {
  // vllm/v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory
  "kv-cache-memory": (c) =>
    vllmCoreDeath(
      c,
      [`${KV_UTILS}, in _check_enough_kv_cache_memory`, "    raise ValueError("],
      "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when " +
        "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    ),
  "max-model-len": (c) => {
    const len = c.maxModelLen ?? 131072
    return vllmCoreDeath(
      c,
      [`${KV_UTILS}, in _check_enough_kv_cache_memory`, "    raise ValueError("],
      `ValueError: To serve at least one request with the models's max seq len (${len}), (16.00 GiB KV cache is ` +
        "needed, which is larger than the available KV cache memory (4.21 GiB). Based on the available memory, the " +
        `estimated maximum model length is ${Math.floor(len / 4)}. Try increasing \`gpu_memory_utilization\` or ` +
        "decreasing `max_model_len` when initializing the engine. See " +
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
  },
  "cuda-oom": (c) =>
    vllmCoreDeath(
      c,
      [
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2540, in load_model',
        "    self.model = model_loader.load_model("
      ],
      TORCH_OOM
    ),
  // vllm/transformers_utils/config.py, get_config: the Hub's refusal, re-raised as a ValueError, in the API server.
  "gated-repo": (c) => ({
    lines: [
      ...hubRefusalChain(c.model),
      '  File "/usr/local/lib/python3.12/dist-packages/vllm/transformers_utils/config.py", line 513, in get_config',
      "    raise ValueError(error_message) from e",
      `ValueError: Invalid repository ID or local directory specified: '${c.model}'.`,
      "Please verify the following requirements:",
      "1. Provide a valid Hugging Face repository ID.",
      "2. Specify a local directory that contains a recognized configuration file.",
      "   - For Hugging Face models: ensure the presence of a 'config.json'.",
      "   - For Mistral models: ensure the presence of a 'params.json'."
    ].map((l) => err(`(APIServer pid=${c.pid}) ${l}`)),
    exit: { code: 1 }
  })
}

// SGLang: the scheduler logs "Scheduler hit an exception: <traceback>" (python/sglang/srt/managers/scheduler.py,
// run_scheduler_process) and SIGQUITs the launcher, whose handler logs "Received sigquit from a child process" and
// kills its own process tree with SIGKILL (python/sglang/srt/entrypoints/engine.py; python/sglang/srt/utils/common.py,
// kill_process_tree). Its logger writes to stderr.
const sglangSchedulerDeath = (c: Ctx, frames: ReadonlyArray<string>, error: string): StartDeath => ({
  lines: [
    `[${ymd(c.now)} ${hms(c.now)} TP0] Scheduler hit an exception: Traceback (most recent call last):`,
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2714, in run_scheduler_process',
    "    scheduler = Scheduler(",
    ...frames,
    error,
    "",
    `[${ymd(c.now)} ${hms(c.now)}] Received sigquit from a child process. It usually means the child failed.`
  ].map(err),
  exit: { signal: "SIGKILL" }
})

const sglang: Partial<Record<StartFailure, (c: Ctx) => StartDeath>> = {
  // python/sglang/srt/model_executor/pool_configurator.py, MemoryPoolConfig.__post_init__
  "kv-cache-memory": (c) =>
    sglangSchedulerDeath(
      c,
      [
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/pool_configurator.py", line 67, in __post_init__',
        "    raise RuntimeError(msg)"
      ],
      "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    ),
  "cuda-oom": (c) =>
    sglangSchedulerDeath(
      c,
      [
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 812, in load_model',
        "    self.model = get_model("
      ],
      TORCH_OOM
    ),
  // transformers src/transformers/utils/hub.py, cached_files, reading the config in the launcher: an uncaught error.
  "gated-repo": (c) => ({
    lines: [
      ...hubRefusalChain(c.model),
      '  File "/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py", line 543, in cached_files',
      "    raise OSError(",
      "OSError: You are trying to access a gated repo.",
      `Make sure to have access to it at https://huggingface.co/${c.model}.`,
      ...gatedRepo(c.model)
    ].map(err),
    exit: { code: 1 }
  })
}

// llama-server: as the real one printed it for a missing -m file (its log prefix: elapsed time, level), ending
// with "exiting due to model loading error" and exit 1 (tools/server/server.cpp). With --fit on (common/arg.cpp's
// default) common_fit_params loads the model once first (common/fit.cpp), so the attempt's lines come twice.
export const llamaLoadDeath = (model: string, cause: ReadonlyArray<string>, fit = false): StartDeath => {
  const attempt = [...cause, "E llama_model_load_from_file_impl: failed to load model"]
  return llamaDeath([
    `I srv    load_model: loading model '${model}'`,
    ...(fit
      ? [
          ...attempt,
          "E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model"
        ]
      : []),
    ...attempt,
    `E cmn  common_init_: failed to load model '${model}'`,
    `E srv    load_model: failed to load model, '${model}'`,
    "I srv    operator(): operator(): cleaning up before exit...",
    "E srv  llama_server: exiting due to model loading error"
  ])
}

/** llama-server's last lines on stderr, each after its log prefix (elapsed time, then the level letter), exit 1. */
export const llamaDeath = (lines: ReadonlyArray<string>): StartDeath => ({
  lines: lines.map((l, i) => err(`0.00.0${String(28 + i).padStart(2, "0")}.159 ${l}`)),
  exit: { code: 1 }
})

const llamaCpp: Partial<Record<StartFailure, (c: Ctx) => StartDeath>> = {
  // ggml/src/gguf.cpp, gguf_init_from_file
  "model-file": (c) =>
    llamaLoadDeath(
      c.model,
      [
        `E gguf_init_from_file: failed to open GGUF file '${c.model}' (No such file or directory)`,
        `E llama_model_load: error loading model: llama_model_loader: failed to load model from ${c.model}`
      ],
      c.fit
    ),
  // ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_buffer_type_alloc_buffer
  "cuda-oom": (c) =>
    llamaLoadDeath(c.model, [
      "E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 18432.00 MiB on device 0: cudaMalloc failed: out of memory"
    ])
}

/** The causes each flavor can die of; mlx-lm none (it loads its model on the first request). */
export const START_FAILURES: Readonly<Record<Flavor, Partial<Record<StartFailure, (c: Ctx) => StartDeath>>>> = {
  vllm,
  sglang,
  llama_cpp: llamaCpp,
  mlx: {}
}

/** What the flavor prints and how it ends when it dies of `cause` at start. */
export const startDeath = (flavor: Flavor, cause: StartFailure, c: Ctx): StartDeath => {
  const make = START_FAILURES[flavor][cause]
  if (make === undefined) throw new Error(`${flavor} has no start failure ${cause}`)
  return make(c)
}
