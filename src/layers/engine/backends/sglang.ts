/**
 * SGLang: `python -m sglang.launch_server --model-path M --host --port --tp-size ... --enable-metrics`.
 * kv_offload hicache/lmcache add cache flags; nixl is only the prefill/decode transfer backend, so it
 * needs a prefill or decode role. KV events need `"publisher":"zmq"` and a page size to hash blocks by.
 * Flags: python/sglang/srt/server_args.py; the KV-events config: python/sglang/srt/disaggregation/kv_events.py
 * (KVEventsConfig, whose `publisher` defaults to "null").
 */

import type { AgentConfig } from "../../../services/config/Config.ts"
import { BREAKS, LISTEN_FLAGS } from "../../../services/engine/AgentFlags.ts"
import type { Engine, ExitHint, MetricNames } from "../../../services/engine/Engine.ts"
import { isLoopbackHost } from "../../../services/net/HostPort.ts"
import { assemble, httpProbeAt, kvEventsOf, listenOf, metricsAt, optionalFlag } from "./common.ts"
import { hicacheTier, sglangLmcacheTier } from "./cpuCacheTiers.ts"
import { commandLineHint, HUB_REFUSALS, hubHint, modelKey, nowValue, TORCH_CUDA_OOM } from "./hints.ts"
import { SGLANG_MARKS } from "./logMarks.ts"

/**
 * What SGLang's own warm-up and /health_generate add to a prefill or decode server's request that has no peer: the
 * fake bootstrap host and a room, no port (python/sglang/srt/entrypoints/http_server.py, _execute_server_warmup and
 * health_generate; FAKE_BOOTSTRAP_HOST = "2.2.2.2", python/sglang/srt/disaggregation/utils.py). Such a request gets
 * the fake KV sender (prefill) or receiver (decode), which report the hand-off done at once
 * (python/sglang/srt/disaggregation/prefill.py and decode.py, the bootstrap queues' `add`; fake/conn.py): a decode
 * server generates on its own, a prefill server answers its one token.
 */
const PEERLESS = { bootstrap_host: "2.2.2.2", bootstrap_room: 0 } as const

/**
 * A decode server forces `disable_radix_cache` unless `--disaggregation-decode-enable-radix-cache` is given,
 * and the hierarchical cache with the radix cache disabled is refused at start as mutually exclusive
 * (python/sglang/srt/server_args.py). With the flag the scheduler runs the decode-side HiCache
 * (`enable_decode_hicache`, python/sglang/srt/managers/scheduler.py), which is what kv_offload "hicache" asks for.
 */
const decodeRadixCache = (role: string, offload: string): ReadonlyArray<string> =>
  role === "decode" && offload === "hicache" ? ["--disaggregation-decode-enable-radix-cache"] : []

/**
 * How SGLang dies at start of a cause the config fixes, newest line first (services/engine/ExitHints.ts). The
 * scheduler logs its traceback ("Scheduler hit an exception: ..."), SIGQUITs the launcher, which logs "Received
 * sigquit from a child process" and SIGKILLs its own process tree (python/sglang/srt/managers/scheduler.py,
 * run_scheduler_process; python/sglang/srt/entrypoints/engine.py; python/sglang/srt/utils/common.py,
 * kill_process_tree): the run ends on SIGKILL, the cause a few lines up.
 */
const exitHints = (config: AgentConfig): ReadonlyArray<ExitHint> => {
  const gmu = modelKey(config, "gpu_memory_utilization")
  const tp = modelKey(config, "tp")
  const now = nowValue(config.model.gpu_memory_utilization)
  return [
    {
      // python/sglang/srt/model_executor/pool_configurator.py, MemoryPoolConfig.__post_init__ (before it:
      // model_runner.py, init_memory_pool): "Not enough memory. Please try to increase --mem-fraction-static."
      patterns: ["Not enough memory. Please try to increase --mem-fraction-static"],
      hint:
        `SGLang has no GPU memory left for its KV cache once the weights are loaded: raise ${gmu}${now} ` +
        `(SGLang's --mem-fraction-static) or spread the model over more GPUs (${tp})`
    },
    {
      // SGLang's own advice for CUDA out of memory: reduce --mem-fraction-static, which sizes the KV pool and
      // leaves the rest to activations and CUDA graphs (sgl-project/sglang docs/references/troubleshooting.md).
      patterns: [TORCH_CUDA_OOM],
      hint:
        `SGLang ran out of GPU memory: lower ${gmu}${now} (SGLang's --mem-fraction-static) to leave more room ` +
        `outside the KV cache, or spread the model over more GPUs (${tp})`
    },
    hubHint(config, HUB_REFUSALS),
    commandLineHint(config, sglang.capabilities.displayName)
  ]
}

/** SGLang's series that carry the load signals and progress (capabilities.metricNames). */
const METRICS: MetricNames = {
  running: ["sglang:num_running_reqs"],
  waiting: ["sglang:num_queue_reqs"],
  kvUsage: ["sglang:token_usage"],
  // The scheduler's counter, moved as its batches run (prefill_compute, prefill_cache, decode tokens:
  // python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector.increment_realtime_tokens).
  // Not sglang:prompt_tokens_total and generation_tokens_total: the tokenizer manager adds a request's tokens
  // only when it finishes (TokenizerMetricsCollector.observe_one_finished_request), so they stand still
  // through long generations on a healthy server. Older servers without it are not watched for progress.
  progress: ["sglang:realtime_tokens_total"],
  // With --dp-size > 1 each replica's scheduler labels its series dp_rank, the replica's index in the
  // DataParallelController's workers, the rank routed_dp_rank and bootstrap_room % dp pick (with
  // --enable-dp-attention too, its attention-DP rank: python/sglang/srt/managers/data_parallel_controller.py
  // launch_tensor_parallel_group); schedulers with attn_tp_rank 0 report, one per replica
  // (python/sglang/srt/observability/scheduler_metrics_mixin.py init_metrics, later metrics_collector.py
  // SchedulerMetricsCollector.init_new; labels since sgl-project/sglang#7597). Without --dp-size: no label.
  rankLabel: "dp_rank"
}

export const sglang: Engine = {
  kind: "sglang",
  capabilities: {
    metricNames: METRICS,
    displayName: "SGLang",
    // python/sglang/srt/server_args.py (argparse, abbreviations allowed: `--tp` is `--tp-size`)
    agentFlags: [
      LISTEN_FLAGS,
      { flags: ["--served-model-name"], key: "models.<name>.served_name", breaks: BREAKS.servedName },
      { flags: ["--tensor-parallel-size", "--tp-size"], key: "models.<name>.tp", breaks: BREAKS.tp },
      { flags: ["--data-parallel-size", "--dp-size"], key: "models.<name>.dp", breaks: BREAKS.dp }
    ],
    modelPath: "directory-or-gguf",
    spawns: true,
    cudaGpus: true,
    kvOffloads: ["none", "hicache", "lmcache", "nixl"],
    roles: ["prefill", "decode", "both"],
    handoff: "bootstrap",
    roleKvOffloads: {
      both: {
        kvOffloads: ["none", "hicache", "lmcache"],
        why: 'SGLang uses "nixl" only as the prefill/decode transfer backend; set agent.role to "prefill" or "decode"'
      },
      // A decode server runs without a radix cache unless told otherwise (python/sglang/srt/server_args.py), and
      // without one the scheduler builds a ChunkCache and never reaches LMCRadixCache
      // (python/sglang/srt/managers/scheduler.py, init_cache): --enable-lmcache would silently do nothing.
      decode: {
        kvOffloads: ["none", "hicache", "nixl"],
        why: "an SGLang decode server has no radix cache, so LMCache would never be used; use it on the prefill server"
      }
    },
    kvEvents: true,
    tensorParallel: true,
    dataParallel: true,
    sources: ["hf_repo", "path"],
    // A finished choice's matched_stop: the stop string, or the token id (EOS too) that ended it
    // (python/sglang/srt/entrypoints/openai/protocol.py, serving_completions.py / serving_chat.py).
    stopSequenceField: "matched_stop",
    // CompletionRequest.ignore_eos (python/sglang/srt/entrypoints/openai/protocol.py)
    ignoreEos: true,
    // SamplingParams.verify (python/sglang/srt/sampling/sampling_params.py): "repetition_penalty must be in (0, 2]"
    requestDialect: {
      ranges: {
        repetition_penalty: { min: 0, max: 2, text: "in (0, 2]", why: "SGLang's sampling parameters allow no more" }
      }
    },
    // CompletionRequest and ChatCompletionRequest take the bootstrap fields (python/sglang/srt/entrypoints/openai/
    // protocol.py); without them a prefill or decode server refuses the request.
    peerlessFields: { prefill: PEERLESS, decode: PEERLESS },
    // A prefill server's default load balancing, follow_bootstrap_room, sends a request to rank bootstrap_room % dp
    // (python/sglang/srt/managers/data_parallel_controller.py); a decode server's round robin takes dp requests to
    // each rank in turn.
    peerlessRankField: "bootstrap_room",
    // A request naming its rank goes to that replica whatever the load-balance method, in every role
    // (DataParallelController.maybe_external_dp_rank_routing, before the room; CompletionRequest and
    // ChatCompletionRequest routed_dp_rank, python/sglang/srt/entrypoints/openai/protocol.py, passed on by
    // serving_completions.py / serving_chat.py). Out of range: 400 "routed_dp_rank=r out of range [0, dp)"
    // (TokenizerManager.generate_request, python/sglang/srt/managers/tokenizer_manager.py). Named so since
    // sgl-project/sglang#19268, which renamed data_parallel_rank (still taken as a deprecated alias); a server
    // without the field ignores it and balances the tests as any request (a P/D prefill server still by room).
    rankField: "routed_dp_rank",
    // The served model's card: max_model_len = model_config.context_len (available_models,
    // python/sglang/srt/entrypoints/http_server.py; ModelCard in python/sglang/srt/entrypoints/openai/protocol.py).
    servedContext: { path: "/v1/models", fields: [["max_model_len"]] },
    // `--api-key` alone: SGLang reads no variable for it (python/sglang/srt/server_args.py), so it is on the command
    // line; every path but /health*, /metrics* (newer: /ready* too) then wants `Bearer <key>` (add_api_key_middleware,
    // python/sglang/srt/utils/auth.py).
    apiKey: { via: { flag: "--api-key" }, flags: ["--api-key"], env: [] }
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const m = config.model
    const offload = config.engine.kv_offload
    const role = config.agent.role
    const events = kvEventsOf(config, "sglang")
    const cache =
      offload === "hicache"
        ? ["--enable-hierarchical-cache", "--hicache-ratio", "2"]
        : offload === "lmcache"
          ? ["--enable-lmcache"]
          : []
    // HiCache's host pool, also when the operator turns it on through args. `--enable-lmcache` is not sized, but
    // said to be unknown (cpuCacheTiers.ts sglangLmcacheTier: which LMCache mode runs is not known from the config).
    const hierarchical =
      offload === "hicache" || [...m.args, ...config.engine.args].includes("--enable-hierarchical-cache")
    // mooncake unless the node runs NIXL: both halves of a pair must use the same (NodeHealth.kv_transfer says which)
    const transfer = role === "both" ? undefined : offload === "nixl" ? "nixl" : "mooncake"
    const disaggregation =
      transfer === undefined
        ? []
        : [
            "--disaggregation-mode",
            role,
            "--disaggregation-transfer-backend",
            transfer,
            ...(role === "prefill" ? ["--disaggregation-bootstrap-port", String(config.engine.bootstrap_port)] : []),
            ...decodeRadixCache(role, offload)
          ]
    // SGLang binds the prefill's bootstrap server to --host (start_disagg_service, python/sglang/srt/
    // disaggregation): on loopback, decode engines on other hosts cannot reach it. Not refused: prefill and
    // decode on one host work so.
    const warnings =
      role === "prefill" && isLoopbackHost(listen.host)
        ? [
            `SGLang binds its P/D bootstrap server (port ${config.engine.bootstrap_port}) to --host ${listen.host}, engine.url's host: decode engines on other hosts cannot reach it. For prefill and decode on different hosts, set engine.url to an address they can reach (the engine takes requests unauthenticated: keep its ports closed to everything but the agent and the decode hosts)`
          ]
        : []
    return assemble(config, listen, {
      executable: ["python", "-m", "sglang.launch_server"],
      kvTransfer: transfer === undefined ? undefined : { value: transfer, flag: "--disaggregation-transfer-backend" },
      args: [
        "--model-path",
        m.source.value,
        "--host",
        listen.host,
        "--port",
        String(listen.port),
        "--tp-size",
        String(m.tp),
        "--served-model-name",
        m.served_name,
        ...optionalFlag("--dp-size", m.dp > 1 ? m.dp : undefined),
        ...optionalFlag("--context-length", m.max_model_len),
        ...optionalFlag("--mem-fraction-static", m.gpu_memory_utilization),
        "--enable-metrics",
        ...cache,
        ...disaggregation,
        // The default page size of 1 would make every token its own event block.
        ...(events !== undefined
          ? ["--page-size", String(config.kv.block_size), "--kv-events-config", events.json]
          : [])
      ],
      // /health and /health_generate are one handler (python/sglang/srt/entrypoints/http_server.py
      // health_generate): 503 while the server is Starting (warm-up); once it is up, a 1-token generation whose
      // answer (or, on a busy server, the scheduler's own) it looks for once a second: 200 a second or so later,
      // 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) from a wedged scheduler. /v1/models answers from the
      // tokenizer manager and never touches the scheduler. `/health` is a bare 200 only with
      // SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false (python/sglang/srt/environ.py, default true).
      probe: httpProbeAt(config, listen, "/health"),
      liveness: { kind: "http", url: `${listen.baseUrl}/health` },
      // Its answer takes a second by design: a probe given less (a liveness_interval under ~1 s) would fail each time.
      livenessTimeoutFloorMs: 3_000,
      metrics: metricsAt(listen, METRICS),
      kvEvents: events?.endpoint,
      warnings,
      cpuCache: hierarchical ? hicacheTier(config) : offload === "lmcache" ? sglangLmcacheTier : undefined,
      exitHints: exitHints(config),
      logLevels: SGLANG_MARKS
    })
  }
}
