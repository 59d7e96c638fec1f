/**
 * The schema of cgn-agent's TOML file: every section, key, type and default.
 * Owns the shape of the config only; reading the file is layers/config/Config.ts, cross-field checks layers/config/crossChecks.ts.
 * Key names are snake_case exactly as written in TOML, so a key path in an error is the key in the file.
 */
import { Effect, Schema } from "effect"
import { clientNameProblem } from "../tls/ClientNames.ts"
import {
  DialableHostPort,
  EtcdEndpoint,
  EtcdPrefix,
  HostPort,
  HttpUrl,
  HttpUrlWithoutCredentials,
  KeyPart,
  OffOrAtLeast,
  PositiveDuration,
  ShortDuration,
  ZmqEndpoint
} from "./ConfigValues.ts"

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * An Xid, as NVIDIA's catalog numbers them (https://docs.nvidia.com/deploy/xid-errors/); 999 is the driver's "unknown
 * Xid" (nvml.h nvmlEventData_t). For `[engine].ignore_xids` and `fault_xids` (services/node/Xid.ts XidRule).
 */
const XidNumber = Schema.Int.check(
  Schema.makeFilter((n) =>
    n >= 1 && n <= 999 ? undefined : `expected an Xid from 1 to 999 (NVIDIA's Xid catalog numbers them), got ${n}`
  )
)

/**
 * A GPU by UUID, as NVML and `nvidia-smi -L` name it: `GPU-<uuid>`, or a MIG instance's `MIG-<uuid>` (older drivers:
 * `MIG-GPU-<uuid>/<gi>/<ci>`). Anything else would reach CUDA_VISIBLE_DEVICES as written where NVML is absent (and
 * CUDA ignores the devices from an invalid entry on), so it is refused here rather than at the GPU gate.
 */
const GpuUuid = Schema.String.check(
  Schema.makeFilter((s) =>
    /^(GPU|MIG)-[0-9A-Za-z/-]+$/.test(s)
      ? undefined
      : `expected an NVML index or a GPU UUID such as "GPU-8b6d1a3c-..." or "MIG-..." (nvidia-smi -L), got "${s}"`
  )
)

const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

export const EngineKinds = ["vllm", "sglang", "llama_cpp", "mlx", "openai_compat"] as const
export type EngineKind = (typeof EngineKinds)[number]
/** The engines an openai_compat server may be (`engine.proxied_kind`). */
export const ProxiedKinds = ["vllm", "sglang", "llama_cpp", "mlx"] as const
export type ProxiedKind = (typeof ProxiedKinds)[number]
export const KvOffloads = ["none", "nixl", "lmcache", "hicache", "kvbm"] as const
export type KvOffload = (typeof KvOffloads)[number]
export const Roles = ["prefill", "decode", "both"] as const
export type Role = (typeof Roles)[number]
export const LogLevels = ["trace", "debug", "info", "warn", "error"] as const

export const ClusterSection = Schema.Struct({
  name: withDefault(KeyPart, "default"),
  etcd: withDefault(Schema.Array(EtcdEndpoint), []),
  etcd_prefix: withDefault(EtcdPrefix, "/cgn"),
  etcd_ca_file: Schema.optionalKey(Schema.String),
  etcd_cert_file: Schema.optionalKey(Schema.String),
  etcd_key_file: Schema.optionalKey(Schema.String),
  etcd_username: Schema.optionalKey(Schema.String),
  etcd_password: Schema.optionalKey(Schema.String)
})

/** A client allowed by `security.allowed_client_names` (services/tls/ClientNames.ts: DNS name, `*.` one label, URI, IP). */
const ClientName = Schema.String.check(Schema.makeFilter((s) => clientNameProblem(s)))

export const SecuritySection = Schema.Struct({
  require_mtls: withDefault(Schema.Boolean, false),
  ca_file: Schema.optionalKey(Schema.String),
  cert_file: Schema.optionalKey(Schema.String),
  key_file: Schema.optionalKey(Schema.String),
  // Absent or empty: any client certificate that chains to ca_file (crossChecks.ts: only with require_mtls).
  allowed_client_names: Schema.optionalKey(Schema.Array(ClientName))
})

export const AgentSection = Schema.Struct({
  listen_grpc: withDefault(HostPort, "0.0.0.0:7071"),
  listen_admin: withDefault(HostPort, "127.0.0.1:9091"),
  // Plaintext grpc.health.v1 only, for probes that cannot present a client certificate (the kubelet's).
  listen_health: Schema.optionalKey(HostPort),
  heartbeat: withDefault(ShortDuration, "5s"),
  ready_probe_url: Schema.optionalKey(HttpUrl),
  role: withDefault(Schema.Literals(Roles), "both"),
  node_id: Schema.optionalKey(KeyPart),
  advertise_addr: Schema.optionalKey(DialableHostPort),
  max_inflight: withDefault(PositiveInt, 256),
  max_queue: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 1024),
  max_tokens_limit: withDefault(PositiveInt, 32768),
  max_request_bytes: withDefault(PositiveInt, 4 * 1024 * 1024),
  lease_ttl: Schema.optionalKey(ShortDuration),
  // No effect any more, accepted so that configs that set it still start (an unknown key exits 2): it damped the
  // liveness probe's unhealthy, which is always a run's teardown now. No default, so that layers/config/exposureWarnings.ts can
  // warn of the key whenever a file sets it (its old default 2 included).
  health_damping: Schema.optionalKey(PositiveInt),
  drain_timeout: withDefault(ShortDuration, "30s"),
  // 0s: never (a caller may hold a stream back for ever, keeping its admission slot and its engine request).
  client_send_timeout: withDefault(ShortDuration, "1m"),
  // From a request's headers to its end (layers/grpc/http2/Server.ts); "0s": never (slow senders hold streams for good).
  request_read_timeout: withDefault(ShortDuration, "10s"),
  // gRPC connections open at once from one peer address, and in all (layers/grpc/http2/Guard.ts); 0: no cap. A router
  // holds one connection per node (grpc-go, grpc-js, grpc-java), a pool or an Envoy one per worker: 64 is far above
  // that, and bounds what one address multiplies its per-connection budgets (rapid resets, streams) by. 4096 is far
  // above a router fleet's few connections each, and bounds the sessions (and their 4096 streams each) the agent holds.
  max_connections_per_peer: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 64),
  max_connections: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 4096),
  // A gRPC connection silent this long gets a PING, and is closed if still silent keepalive_timeout later
  // (services/grpc/Keepalive.ts): a client whose host vanished sends no FIN. "0s": never (its connections stay).
  keepalive_time: withDefault(
    OffOrAtLeast(1_000, "every idle connection would be pinged as often (grpc-go's server takes 1s at the least)"),
    "1m"
  ),
  keepalive_timeout: withDefault(
    PositiveDuration("a connection pinged would be closed at once, before its client could answer"),
    "20s"
  ),
  handoff_timeout: withDefault(PositiveDuration("every prefill and decode leg would time out at once"), "30s"),
  state_dir: withDefault(Schema.NonEmptyString, "/var/lib/cgn-agent"),
  log_level: withDefault(Schema.Literals(LogLevels), "info"),
  admin_token: Schema.optionalKey(Schema.NonEmptyString),
  otlp_endpoint: Schema.optionalKey(HttpUrl)
})

export const EngineSection = Schema.Struct({
  kind: withDefault(Schema.Literals(EngineKinds), "vllm"),
  // openai_compat: the engine serving engine.url, when known, whose request dialect and answers the agent then
  // expects (layers/engine/backends/index.ts engineFor)
  proxied_kind: Schema.optionalKey(Schema.Literals(ProxiedKinds)),
  url: withDefault(
    HttpUrlWithoutCredentials(
      "an engine that asks for an API key gets it from engine.api_key, which the agent sends as a bearer token (and hands to an engine it spawns)"
    ),
    "http://127.0.0.1:8000"
  ),
  // Sent as `Authorization: Bearer` on every request to engine.url's origin, and given to a spawned engine, which then
  // refuses calls without it (the backend's capabilities.apiKey says how); decodeConfig.ts reads the env fallback.
  api_key: Schema.optionalKey(Schema.NonEmptyString),
  kv_offload: withDefault(Schema.Literals(KvOffloads), "none"),
  command: Schema.optionalKey(Schema.NonEmptyArray(Schema.NonEmptyString)),
  args: withDefault(Schema.Array(Schema.String), []),
  env: withDefault(Schema.Record(Schema.String, Schema.String), {}),
  startup_timeout: withDefault(
    PositiveDuration("every engine start would time out before the engine could be ready"),
    "30m"
  ),
  stop_grace: withDefault(ShortDuration, "30s"),
  restart_backoff_initial: withDefault(
    PositiveDuration("a crashing engine would be restarted at once, over and over (the backoff doubles 0)"),
    "1s"
  ),
  restart_backoff_max: withDefault(
    PositiveDuration("a crashing engine would be restarted at once, over and over (no delay is longer than 0)"),
    "5m"
  ),
  restart_stable_after: withDefault(ShortDuration, "10m"),
  liveness_interval: withDefault(
    PositiveDuration("a ready engine would be probed without pause, each probe given no time to answer"),
    "5s"
  ),
  liveness_failures: withDefault(PositiveInt, 3),
  side_channel_host: Schema.optionalKey(Schema.NonEmptyString),
  side_channel_port: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 65535 })), 5600),
  bootstrap_port: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 65535 })), 8998),
  kvbm_cpu_cache_gb: Schema.optionalKey(Schema.Finite.check(Schema.isGreaterThan(0))),
  kvbm_disk_cache_gb: Schema.optionalKey(Schema.Finite.check(Schema.isGreaterThan(0))),
  liveness_path: Schema.optionalKey(
    Schema.String.check(
      Schema.makeFilter((s) =>
        /^\/[^\s?#]*$/.test(s) ? undefined : `expected a path on the engine such as "/health_generate", got "${s}"`
      )
    )
  ),
  stream_idle_timeout: withDefault(
    PositiveDuration("every engine stream would be ended at its first pause between two chunks"),
    "5m"
  ),
  // How long the engine may stay stalled (see stream_idle_timeout) before it is restarted; "0s": never.
  stall_restart_after: withDefault(ShortDuration, "5m"),
  // How long a Ready engine may have no call before the agent sends it a test completion; "0s": never.
  idle_probe_after: withDefault(ShortDuration, "2m"),
  // Calls in a row the engine fails (services/engine/FailedCalls.ts) before the node is unhealthy; 0: never.
  failed_calls_unhealthy: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 5),
  verify_listener: withDefault(Schema.Boolean, true),
  gpu_free_timeout: withDefault(ShortDuration, "2m"),
  gpu_free_below_mib: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 1024),
  // Xids that make no GPU faulty on top of the application errors, and Xids that do even so (NVIDIA k8s-device-plugin's
  // DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS); crossChecks refuses an Xid in both.
  ignore_xids: withDefault(Schema.Array(XidNumber), []),
  fault_xids: withDefault(Schema.Array(XidNumber), [])
})

export const ModelSection = Schema.Struct({
  hf_repo: Schema.optionalKey(Schema.NonEmptyString),
  path: Schema.optionalKey(Schema.NonEmptyString),
  tp: withDefault(PositiveInt, 1),
  dp: withDefault(PositiveInt, 1),
  served_name: Schema.optionalKey(Schema.NonEmptyString),
  // ListModels' max_model_len is a uint32 (proto/cgn/agent/v1/agent.proto ModelInfo)
  max_model_len: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 4_294_967_295 }))),
  gpu_memory_utilization: Schema.optionalKey(
    Schema.Number.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1))
  ),
  args: withDefault(Schema.Array(Schema.String), []),
  gpus: withDefault(Schema.Array(Schema.Union([Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), GpuUuid])), [])
})

/** `[kv].block_size` when the file does not set it. */
export const DEFAULT_KV_BLOCK_SIZE = 16

export const KvSection = Schema.Struct({
  uds: Schema.optionalKey(Schema.NonEmptyString),
  events: withDefault(Schema.Boolean, false),
  events_endpoint: withDefault(ZmqEndpoint, "tcp://127.0.0.1:5557"),
  replay_endpoint: Schema.optionalKey(ZmqEndpoint),
  topic: withDefault(Schema.String, "kv-events"),
  block_size: withDefault(PositiveInt, DEFAULT_KV_BLOCK_SIZE),
  max_queue_bytes: withDefault(PositiveInt, 32 * 1024 * 1024)
})

const section = <S extends Schema.Top>(schema: S) => withDefault(schema, {} as S["Encoded"])

/** The whole file as decoded by Schema, before cross-field checks. */
export const ConfigFile = Schema.Struct({
  cluster: section(ClusterSection),
  security: section(SecuritySection),
  agent: section(AgentSection),
  engine: section(EngineSection),
  models: withDefault(Schema.Record(Schema.String, ModelSection), {}),
  kv: section(KvSection)
})
export type ConfigFile = typeof ConfigFile.Type

/** Every valid key per section, for unknown-key errors with suggestions. */
export const knownKeys: Readonly<Record<string, ReadonlyArray<string>>> = {
  "": Object.keys(ConfigFile.fields),
  cluster: Object.keys(ClusterSection.fields),
  security: Object.keys(SecuritySection.fields),
  agent: Object.keys(AgentSection.fields),
  engine: Object.keys(EngineSection.fields),
  model: Object.keys(ModelSection.fields),
  kv: Object.keys(KvSection.fields)
}
