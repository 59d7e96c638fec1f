/**
 * Engine: the narrow contract every backend (vllm, sglang, llama_cpp, mlx, openai_compat) fulfils. A backend is data plus
 * one pure function: what it can do (capabilities) and how to launch it (render). Backends never spawn, signal or do
 * I/O: EngineProcess runs the plan, EngineClient talks to it.
 */
import { Context } from "effect"
import type { AgentConfig, EngineKind, KvOffload, ProxiedKind, Role } from "../config/Config.ts"
import type { AgentFlag } from "./AgentFlags.ts"
import type { CpuCacheTier } from "./CpuCache.ts"
import type { EnvironmentNeed } from "./EngineEnvironment.ts"
import type { LogLevelMarks } from "./LineLevels.ts"

/**
 * How a prefill engine hands a request's KV cache to a decode engine, as the agent sees it on the wire
 * (services/grpc/Handoff.ts writes the leg bodies for each):
 * - "kv_transfer_params": vLLM's KV connector (NIXL). The prefill leg asks for one token with
 *   `kv_transfer_params` {do_remote_decode}; P's whole response carries the params D needs to pull, which
 *   the router passes to the decode leg verbatim (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
 * - "bootstrap": SGLang's rendezvous. Both legs carry `bootstrap_host/port/room`, chosen by the router
 *   (python/sglang/srt/entrypoints/openai/protocol.py).
 */
export type HandoffProtocol = "kv_transfer_params" | "bootstrap"

/** What the engine needs `models.x.path` to be on its host (`check` looks: programs/modelPath.ts). */
export type ModelPathKind = "gguf-file" | "directory-or-gguf" | "directory"

/** What a backend supports; config validation refuses everything else, naming these lists. */
export interface EngineCapabilities {
  /** The engine's name in the agent's messages (an exit hint, a check finding). */
  readonly displayName: string
  /** False for openai_compat: the agent proxies to `engine.url` and starts nothing. */
  readonly spawns: boolean
  /** What `models.x.path` must be for the engine to load it; absent: not checked (a proxied server's own). */
  readonly modelPath?: ModelPathKind
  readonly kvOffloads: ReadonlyArray<KvOffload>
  readonly roles: ReadonlyArray<Role>
  /** The P/D handoff of the prefill and decode roles; absent for an engine without them (role "both" only). */
  readonly handoff?: HandoffProtocol
  /** Whether the engine can publish KV-cache events over ZMQ (`[kv].events`). */
  readonly kvEvents: boolean
  /** Whether tensor parallelism (`tp` > 1) can be expressed on its command line. */
  readonly tensorParallel: boolean
  /** Whether data parallelism (`dp` > 1) can be expressed on its command line; absent means no. */
  readonly dataParallel?: boolean
  /** Where the weights may come from. */
  readonly sources: ReadonlyArray<"hf_repo" | "path">
  /**
   * Roles that accept only some of `kvOffloads` (vLLM prefill/decode need NIXL to hand the KV cache over);
   * `why` ends the error message. A role not listed accepts every entry of `kvOffloads`.
   */
  readonly roleKvOffloads?: Partial<
    Record<Role, { readonly kvOffloads: ReadonlyArray<KvOffload>; readonly why: string }>
  >
  /**
   * Whether the engine runs on NVIDIA GPUs that the agent hands out (CUDA_VISIBLE_DEVICES, `models.x.gpus`) and waits
   * to be free before a (re)start; absent means it does not (mlx runs on Apple silicon, openai_compat starts nothing).
   */
  readonly cudaGpus?: boolean
  /**
   * The engine closes the connection right after a streamed answer, though its headers say keep-alive (llama-server:
   * its last chunk, then a half-close): the client asks for no keep-alive on streams, so no call is sent on a
   * connection the engine is closing (one was, about 1 in 100 at three concurrent callers, and failed "other side
   * closed"). Absent means the engine keeps streamed connections alive.
   */
  readonly closesStreamedConnections?: boolean
  /**
   * The `kv_offload` values with which the engine listens on `engine.side_channel_port` + its DP rank (vLLM's NIXL
   * handshake, VLLM_NIXL_SIDE_CHANNEL_PORT); absent means it never does (config checks the last rank's port).
   */
  readonly sideChannelOffloads?: ReadonlyArray<KvOffload>
  /** `[models.x]` settings the command line can express; absent means both. */
  readonly modelSettings?: ReadonlyArray<"max_model_len" | "gpu_memory_utilization">
  /** Characters the served model name may not contain on this engine's command line; `why` ends the message. */
  readonly servedNameForbids?: { readonly chars: string; readonly why: string }
  /** Where the engine's OpenAI request differs from the names and ranges the agent writes; absent means none. */
  readonly requestDialect?: RequestDialect
  /**
   * The field of a finished choice that names the stop string which ended it (vLLM `stop_reason`, SGLang
   * `matched_stop`; a token id there is not a stop string and is left out); absent: the engine does not say.
   */
  readonly stopSequenceField?: string
  /**
   * Whether the completions endpoint takes `ignore_eos` (generate to max_tokens whatever the model says): the stall
   * watchdog's test completion asks for it, so a model's early end-of-sequence cannot pass for a working engine.
   */
  readonly ignoreEos?: boolean
  /**
   * Body fields, by role, that let the engine serve a request of the agent's own with no P/D peer (the stall
   * watchdog's test completion); a role not listed needs none. SGLang refuses a prefill or decode request without
   * its bootstrap fields, and serves one naming its fake bootstrap host without a peer.
   */
  readonly peerlessFields?: Partial<Record<Role, Readonly<Record<string, string | number>>>>
  /**
   * The field of `peerlessFields` that picks the data-parallel rank a request runs on (SGLang's prefill server sends
   * each request to rank `bootstrap_room % dp`): with dp > 1 the probe sends one request per rank, the field set to
   * the rank, so a wedged rank other than the first cannot hide behind a working one.
   */
  readonly peerlessRankField?: string
  /**
   * The body field that pins a request to a data-parallel rank in every role, where the engine takes one (SGLang's
   * `routed_dp_rank`): with dp > 1 the stall watchdog's test completion is sent once per rank with it (beside
   * `peerlessRankField` on a P/D node), so a rank that hangs alone cannot hide behind the others.
   */
  readonly rankField?: string
  /**
   * The request header that pins a request to a data-parallel rank, where the engine takes one: with dp > 1 the stall
   * watchdog's test completion is sent once per rank with it, so a rank that hangs alone cannot hide behind the others.
   */
  readonly rankHeader?: string
  /**
   * Where the engine says how many tokens one request can span (prompt and output together), read once a run is Ready
   * (layers/engine/ServedContext.ts); absent: the engine does not say (mlx-lm). It can be less than what the config
   * renders: llama-server splits `-c` among its `-np` slots.
   */
  readonly servedContext?: ServedContextSource
  /**
   * The Prometheus series at the engine's `/metrics` that carry its load signals and progress (the plan's `metrics`);
   * absent: it exports none (mlx-lm). A proxied server of a known kind (`engine.proxied_kind`) is read by them too.
   */
  readonly metricNames?: MetricNames
  /**
   * How the engine takes an API key, which it then requires of the agent's calls (`engine.api_key`): `via`, how the
   * agent hands the key to an engine it spawns (a variable of its environment where it reads one, since any local user
   * can read a command line; else a flag); `flags` and `env`, every way the engine takes a key, refused in
   * engine.args, models.x.args and engine.env (a key the agent does not know would have the engine refuse the agent's
   * own calls). Absent: the engine has none, and a spawned one is refused `engine.api_key`; a proxied server's key is
   * only sent (layers/engine/backends/engineKey.ts).
   */
  readonly apiKey?: {
    readonly via: { readonly env: string } | { readonly flag: string }
    readonly flags: ReadonlyArray<string>
    readonly env: ReadonlyArray<string>
  }
  /** The flags the agent renders from the config and relies on: refused in engine.args and models.x.args (AgentFlags.ts). */
  readonly agentFlags?: ReadonlyArray<AgentFlag>
  /**
   * How the engine's error messages begin where it could not make an answer of what the model generated for that one
   * request (the request and the engine are fine; the output was not): such a failure is the request's, not the
   * node's (EngineErrors.ts markOutputFault; services/grpc/GrpcStatus.ts). Absent: the engine has none known.
   */
  readonly outputFaults?: ReadonlyArray<string>
}

/**
 * An OpenAI model list (GET `path`, `{"data": [...]}`) whose entry for the served model (its `id`; else the list's only
 * entry) holds the per-request context at the first of `fields` (key paths) that is a positive integer.
 */
export interface ServedContextSource {
  readonly path: string
  readonly fields: ReadonlyArray<ReadonlyArray<string>>
}

/** What a render may need of this host beyond the config (absent: the config alone, as in pure tests). */
export interface RenderHost {
  /**
   * The host this node advertises to its peers (services/registry/Advertise.ts: advertise_addr, NODE_IP, listen_grpc's
   * host, else this host's first external IPv4), for what an engine must publish to a peer on another host.
   */
  readonly advertiseHost?: string
}

/** An engine's own spelling of the OpenAI request (services/grpc/Generate.ts writes the body through it). */
export interface RequestDialect {
  /** Body fields the engine reads under another name (llama-server: `repeat_penalty`), by the agent's name. */
  readonly fieldNames?: Readonly<Record<string, string>>
  /** The largest `seed` the engine keeps as given; a larger one is refused with `why`. */
  readonly maxSeed?: { readonly value: bigint; readonly why: string }
  /**
   * The `top_k` that means no top-k filtering, where the engine refuses the agent's -1 ("off") for it (mlx-lm: 0,
   * and a negative value raises in `validate_model_parameters`, answered with no HTTP response at all).
   */
  readonly topKOff?: number
  /**
   * Sampling fields the engine takes in a narrower range than the agent's own (inclusive bounds, by the agent's body
   * name): a call outside it is refused here, naming the engine's rule (`text` ends "x must be ...": "in (0, 2]").
   */
  readonly ranges?: Readonly<
    Record<string, { readonly min: number; readonly max: number; readonly text: string; readonly why: string }>
  >
}

/**
 * One well-known way the engine dies at start, as data: lines it prints when it does (substrings, matched as
 * written: plain data, which a launch plan carries through JSON), and what to change in the agent's config, naming the
 * keys. Matched newest line first over a failed run's last lines (services/engine/ExitHints.ts), told with the exit.
 */
export interface ExitHint {
  readonly patterns: ReadonlyArray<string>
  readonly hint: string
}

/** How readiness is decided; `authorization`: the engine's (LaunchPlan.authorization) on a probe of its own origin. */
export type ReadinessProbe =
  /**
   * GET `url`; 200 means ready; connection refused or 503 mean "not yet". `modelList`: the answer is an OpenAI model
   * list, and a 200 that lists this model (the name the engine serves) as still loading is "not yet" (ModelList.ts).
   */
  | (ProbeKey & { readonly kind: "http"; readonly url: string; readonly modelList?: string })
  /** POST a real 1-token completion (mlx, whose /health is green before the model is loaded). */
  | (ProbeKey & { readonly kind: "completion"; readonly url: string; readonly body: Readonly<Record<string, unknown>> })

/**
 * engine.api_key on a probe: `authorization` on one that asks the engine's own origin; `keyWithheld` on one that asks
 * another (a ready_probe_url elsewhere, or the same server spelled otherwise), so that its 401 says why.
 */
export interface ProbeKey {
  readonly authorization?: string
  readonly keyWithheld?: true
}

/** Which of the engine's Prometheus series carry the normalized load signals, newest name first. */
export interface MetricNames {
  readonly running: ReadonlyArray<string>
  readonly waiting: ReadonlyArray<string>
  /** KV-cache usage as a 0..1 fraction; empty when the engine does not export one (llama.cpp). */
  readonly kvUsage: ReadonlyArray<string>
  /**
   * Counters that move whenever the engine computes (a forward pass, a prompt prefilled, a token generated), each
   * summed over its label sets: the stall rule's proof of no progress (EngineProgress.ts). Only counters that move
   * while a request is still running: one that counts a request's tokens as it finishes stands still through a long
   * generation on a healthy engine. Absent or empty: the engine is not watched for progress.
   */
  readonly progress?: ReadonlyArray<string>
  /**
   * The label that names the data-parallel rank on those series (vLLM's `engine`, SGLang's `dp_rank`), where they
   * have one, its value the rank the test completion names (rankHeader, rankField, peerlessRankField): a rank whose
   * own counters or KV-cache usage move is at work, so a test it is slow to answer (queued behind its calls) does not
   * read as a rank that hangs (layers/engine/stallProbe.ts).
   */
  readonly rankLabel?: string
}

/** The KV-event stream the engine publishes when `[kv].events` is on. */
export interface KvEventsEndpoint {
  /** The ZMQ endpoint handed to the engine. */
  readonly endpoint: string
  /** Whether the engine binds it (endpoint contains `*`, `::`, or is ipc/inproc) or connects to it. */
  readonly engineBinds: boolean
  readonly replayEndpoint: string | undefined
  readonly topic: string
  /** Data-parallel ranks; rank r publishes on `endpoint` (and `replayEndpoint`) offset by r. Absent means 1. */
  readonly dpSize?: number
}

/** Everything needed to start and use the engine; rendering it has no side effects. */
export interface LaunchPlan {
  readonly kind: EngineKind
  /**
   * openai_compat: the engine serving `baseUrl`, when the config says (`engine.proxied_kind`): its wire habits are the
   * agent's to expect (engineFor(kind, proxiedKind)). Absent: unknown, or a spawned engine (its kind says).
   */
  readonly proxiedKind?: ProxiedKind
  /**
   * A P/D node's KV transfer backend, which its peers' must equal (NodeHealth.kv_transfer): SGLang's
   * `--disaggregation-transfer-backend` (mooncake, nixl), vLLM's `kv_connector` (NixlConnector). Absent: role both.
   */
  readonly kvTransfer?: string
  readonly spawns: boolean
  /** Full argv, executable first ([] when nothing is spawned). `[engine].command` replaces the executable. */
  readonly argv: ReadonlyArray<string>
  /** Variables added to the agent's environment for the engine. */
  readonly env: Readonly<Record<string, string>>
  /** The engine's HTTP base URL, e.g. `http://127.0.0.1:8000`. */
  readonly baseUrl: string
  /** `Bearer <engine.api_key>` for every request to `baseUrl`'s origin, never another (a ready_probe_url elsewhere). */
  readonly authorization?: string
  readonly host: string
  readonly port: number
  readonly probe: ReadinessProbe
  /** What a ready engine is polled with (`[engine].liveness_path`, else the engine's choice); absent: `probe`. */
  readonly liveness?: ReadinessProbe | undefined
  /**
   * The least time one liveness probe is given, where the engine's answer takes its time by design (SGLang's
   * `/health` waits a second for its own 1-token generation); else min(liveness_interval, 5 s) alone bounds it.
   */
  readonly livenessTimeoutFloorMs?: number
  /** Prometheus endpoint and series names; undefined when the engine has none (mlx, openai_compat). */
  readonly metrics: { readonly url: string; readonly names: MetricNames } | undefined
  readonly kvEvents: KvEventsEndpoint | undefined
  /** The name clients use for the model. */
  readonly servedModel: string
  /** The value to put in a request's `model` field when forwarding (mlx loads whatever it is given). */
  readonly requestModel: string
  /** NVML indices of the engine's GPUs (also in env as CUDA_VISIBLE_DEVICES); undefined when not known. */
  readonly gpus?: ReadonlyArray<number>
  /** What the backend sees wrong with a valid config for this engine, logged once at start (not refused). */
  readonly warnings?: ReadonlyArray<string>
  /**
   * Where the engine's CPU KV-cache tier takes its size from, as data (services/engine/CpuCache.ts): variables of the
   * environment the engine really gets (the agent's own, the plan's, `[engine].env`), where a container's `env:`
   * counts too, a config file one names, an argv flag, the connector's default; absent when the engine has no such
   * tier. The agent's memory cgroup limit is checked against it, at start and by `check`.
   */
  readonly cpuCache?: CpuCacheTier
  /**
   * What the environment the engine really gets (the agent's own, the plan's, `[engine].env`) must give it, or it
   * exits at every start (KVBM with no cache tier): `check` refuses the config without it. Absent: nothing.
   */
  readonly environmentNeed?: EnvironmentNeed
  /** The engine's well-known start failures and their fixes (the newest matching line decides); absent: none known. */
  readonly exitHints?: ReadonlyArray<ExitHint>
  /** How the engine marks its log lines' levels, each line logged at its own (LineLevels.ts); absent: all at info. */
  readonly logLevels?: LogLevelMarks
}

/** One backend. */
export interface Engine {
  readonly kind: EngineKind
  readonly capabilities: EngineCapabilities
  /** Renders the plan; the config has already been validated against `capabilities`. */
  readonly render: (config: AgentConfig, host?: RenderHost) => LaunchPlan
}

/**
 * The configured engine's plan, rendered once at start: the supervisor runs it, the client and the KV
 * bridge talk to the endpoints it names, so all three agree on one value.
 */
export class EnginePlan extends Context.Service<EnginePlan, LaunchPlan>()("cgn-agent/EnginePlan") {}
