/**
 * llama.cpp: `llama-server -m FILE | -hf REPO -a SERVED --host --port [-c N] -ngl 999 --metrics`.
 * No tensor parallelism, GPU memory fraction, KV connector, events or disaggregation; all layers are
 * offloaded to the GPU and the Prometheus endpoint is switched on.
 *
 * Readiness is GET `/health`: it answers 503 "Loading model" until the model is loaded in every version,
 * while newer builds answer `/models` and `/v1/models` 200 during loading (llama.cpp
 * `tools/server/server-http.cpp`, `middleware_server_state`).
 */

import type { AgentConfig } from "../../../services/config/Config.ts"
import { BREAKS, LISTEN_FLAGS } from "../../../services/engine/AgentFlags.ts"
import { lastFlagValue } from "../../../services/engine/ArgvFlags.ts"
import type { Engine, ExitHint, MetricNames } from "../../../services/engine/Engine.ts"
import { assemble, listenOf, metricsAt, optionalFlag } from "./common.ts"
import { commandLineHint, modelKey, nowValue, sourceKey } from "./hints.ts"
import { LLAMA_CPP_MARKS } from "./logMarks.ts"

/**
 * How llama-server dies at start of a cause the config fixes, newest line first (services/engine/ExitHints.ts). Its
 * last line is always "exiting due to model loading error" (tools/server/server.cpp), whatever the cause, so the
 * table names the lines above it that tell the causes apart.
 */
const exitHints = (config: AgentConfig): ReadonlyArray<ExitHint> => [
  {
    // ggml/src/gguf.cpp: gguf_init_from_file "failed to open GGUF file '%s'" (newer builds add " (strerror)"), and
    // the header check "invalid magic characters: '%c%c%c%c', expected 'GGUF'". Seen from the real llama-server
    // (test/real/llama-cpp-start-failure.test.ts).
    patterns: ["failed to open GGUF file", "invalid magic characters"],
    hint: `llama-server could not read the model file ${sourceKey(config)} names: it must be an existing, readable GGUF file on this host`
  },
  {
    // src/llama-model-loader.h, load_all_data's bounds check: "tensor '%s' data is not within the file bounds, model
    // is corrupted or incomplete" (a download cut short, a copy still being written)
    patterns: ["model is corrupted or incomplete"],
    hint: `the model file ${sourceKey(config)} names is cut short or corrupted (its tensors run past its end): download or copy it again whole`
  },
  {
    // tools/server/server-http.cpp, start: "couldn't bind HTTP server socket, hostname: %s, port: %d", then
    // server.cpp "exiting due to HTTP server error". The agent checks the port before it starts the engine; another
    // process can take it between a run and the next (during the restart backoff).
    patterns: ["couldn't bind HTTP server socket"],
    hint: `llama-server could not listen on ${listenOf(config).host}:${listenOf(config).port} (engine.url): another process holds that port (ss -ltnp names it), or the host is not an address of this machine`
  },
  {
    // ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_buffer_type_alloc_buffer: "allocating %.2f MiB on device
    // %d: cudaMalloc failed: %s", CUDA's text for cudaErrorMemoryAllocation being "out of memory".
    patterns: ["cudaMalloc failed: out of memory"],
    hint:
      `llama-server ran out of GPU memory: lower ${modelKey(config, "max_model_len")}${nowValue(config.model.max_model_len)} ` +
      "(its -c, whose KV cache it allocates at start) or use a smaller quantization of the model"
  },
  commandLineHint(config, llamaCpp.capabilities.displayName)
]

/**
 * llama-server's slots, the requests it decodes at once: `-np`/`--parallel` (the last given), else the
 * LLAMA_ARG_N_PARALLEL it reads when the flag is absent (common/arg.cpp), else -1, "auto", which
 * tools/server/server.cpp makes 4. Undefined when the value is not an integer (llama-server then refuses to start).
 */
export const llamaServerSlots = (args: ReadonlyArray<string>, env: Readonly<Record<string, string>>) => {
  const given = lastFlagValue(args, ["-np", "--parallel"]) ?? env.LLAMA_ARG_N_PARALLEL
  const n = given === undefined ? -1 : Number(given)
  if (!Number.isInteger(n)) return undefined
  return n < 0 ? 4 : n
}

/**
 * More calls relayed at once than llama-server has slots wait in llama-server's own queue, where a cancelled one
 * keeps its place and is still run once a slot frees, its prompt evaluated for nobody (ggml-org/llama.cpp#13262,
 * seen on the real server: every call of a 32-call burst cancelled by its deadline was given a slot afterwards).
 * Waiting in the agent instead (agent.max_inflight at the slots), a cancelled call is dropped at once, and a call
 * whose deadline cannot be met is shed while the router can still try another node.
 */
const slotWarnings = (config: AgentConfig): ReadonlyArray<string> => {
  const slots = llamaServerSlots([...config.model.args, ...config.engine.args], config.engine.env)
  const inflight = config.agent.max_inflight
  return slots === undefined || inflight <= slots
    ? []
    : [
        `agent.max_inflight (${inflight}) is above llama-server's ${slots} slots (-np/--parallel in engine.args; 4 when not given): calls beyond the slots wait in llama-server's own queue, where a cancelled call keeps its place and is still run. Set agent.max_inflight = ${slots} so they wait in the agent, which drops a cancelled call at once and sheds one its deadline cannot meet`
      ]
}

/** llama-server's series (with `--metrics`) that carry the load signals and progress (capabilities.metricNames). */
const METRICS: MetricNames = {
  running: ["llamacpp:requests_processing"],
  waiting: ["llamacpp:requests_deferred"],
  kvUsage: [],
  // One per llama_decode() call: each prompt batch and each generated token (tools/server/server-context.cpp
  // server_metrics::on_decoded). Not llamacpp:tokens_predicted_total: a request's tokens are added as it
  // finishes (on_prediction), so it stands still through a long generation (measured on the real
  // llama-server). Its /metrics is answered by the server loop itself (a SERVER_TASK_TYPE_METRICS task), so
  // a hung loop fails the scrape: unknown, never "no progress".
  progress: ["llamacpp:n_decode_total"]
}

export const llamaCpp: Engine = {
  kind: "llama_cpp",
  capabilities: {
    metricNames: METRICS,
    displayName: "llama-server",
    // common/arg.cpp: `-a, --alias`, `--host`, `--port`
    agentFlags: [
      LISTEN_FLAGS,
      { flags: ["--alias", "-a"], key: "models.<name>.served_name", breaks: BREAKS.servedName }
    ],
    modelPath: "gguf-file",
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: false,
    sources: ["hf_repo", "path"],
    modelSettings: ["max_model_len"],
    // `-a` is a comma-separated list of aliases (llama.cpp `common/arg.cpp`, `--alias`).
    servedNameForbids: { chars: ",", why: "llama-server splits -a on commas into several aliases" },
    // common_chat_parse (common/chat.cpp) throws when the model's output does not parse in the request's chat
    // format, plain completions' "Content-only" too (a lone UTF-8 continuation byte generated does it), and the
    // server answers 500 server_error, or an error event mid-stream: the same request fails so on any node at
    // temperature 0, and the engine serves every other request.
    outputFaults: ["The model produced output that does not match the expected "],
    // llama-server's request schema (tools/server/server-schema.cpp): the repetition penalty is `repeat_penalty`
    // (a `repetition_penalty` field is ignored, silently), and `seed` is a uint32_t whose 0xFFFFFFFF is
    // LLAMA_DEFAULT_SEED, "use a random seed" (include/llama.h); larger values keep only their low 32 bits.
    requestDialect: {
      fieldNames: { repetition_penalty: "repeat_penalty" },
      maxSeed: {
        value: 4_294_967_294n,
        why: "llama-server keeps a 32-bit seed, and 4294967295 means a random one"
      },
      // common_sampler_init (common/sampling.cpp) refuses a penalty whose float inverse is not finite, a request
      // failing "Failed to initialize samplers: penalty_repeat must be finite and greater than 0": the least float
      // with a finite inverse is 2.938737278e-39 (written 2.938737e-39; the float nearest 2.938736e-39 is below
      // 1/FLT_MAX, and the real server answers it 400, 2.9387373e-39 200)
      ranges: {
        repetition_penalty: {
          min: 2.938737e-39,
          max: Number.POSITIVE_INFINITY,
          text: "at least 2.938737e-39 and finite",
          why: "llama-server inverts it as a float, and refuses a penalty whose inverse is not finite"
        }
      }
    },
    // `ignore_eos` in the request (tools/server/server-schema.cpp, params_from_json_cmpl)
    ignoreEos: true,
    // measured on the real server (test/real/sim-differential.test.ts): a streamed answer's connection is closed
    // after its last chunk, a whole answer's kept
    closesStreamedConnections: true,
    // `meta.n_ctx` is one slot's context, what one request can use: `-c` / `-np` (padded to 256), or all of `-c` with
    // --kv-unified, capped at the model's training context (tools/server/server-context.cpp get_res_model_info,
    // meta.slot_n_ctx = n_ctx_slot(); src/llama-context.cpp n_ctx_seq). /props default_generation_settings.n_ctx says
    // the same.
    servedContext: { path: "/v1/models", fields: [["meta", "n_ctx"]] },
    // `--api-key`, `--api-key-file` or their variables LLAMA_API_KEY, LLAMA_ARG_API_KEY_FILE (common/arg.cpp); every path
    // but /health and /v1/health (its web UI's too) then answers 401 without a key (tools/server/server-http.cpp,
    // middleware_validate_api_key).
    apiKey: {
      via: { env: "LLAMA_API_KEY" },
      flags: ["--api-key", "--api-key-file"],
      env: ["LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE"]
    }
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    return assemble(config, listen, {
      executable: ["llama-server"],
      args: [
        m.source.kind === "path" ? "-m" : "-hf",
        m.source.value,
        "-a",
        m.served_name,
        "--host",
        listen.host,
        "--port",
        String(listen.port),
        ...optionalFlag("-c", m.max_model_len),
        "-ngl",
        "999",
        "--metrics"
      ],
      probe: { kind: "http", url: config.agent.ready_probe_url ?? `${listen.baseUrl}/health` },
      metrics: metricsAt(listen, METRICS),
      exitHints: exitHints(config),
      warnings: slotWarnings(config),
      logLevels: LLAMA_CPP_MARKS
    })
  }
}
