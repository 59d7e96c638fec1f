/**
 * The schema of cgn-agent's TOML file: every section, key, type and default.
 * Owns the shape of the config only; reading the file is layers/config/Config.ts, cross-field checks layers/config/crossChecks.ts.
 * Key names are snake_case exactly as written in TOML, so a key path in an error is the key in the file.
 */
import * as net from "node:net"
import { Duration, Effect, Option, Schema, SchemaIssue, SchemaTransformation } from "effect"
import { isWildcardHost, splitHostPort } from "../registry/Advertise.ts"

const UNIT: Record<string, Duration.Unit> = { ms: "millis", s: "seconds", m: "minutes", h: "hours", d: "days" }

/** Parses `500ms`, `5s`, `2m`, `1h`, `1d` (blanks around the number and between it and the unit are allowed). */
export const parseShortDuration = (text: string): Option.Option<Duration.Duration> => {
  const m = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/.exec(text.trim())
  if (!m) return Option.none()
  // Millisecond resolution: "0.0000001s" would otherwise reach Duration as "1e-7 seconds" and throw;
  // a positive duration under 1ms (or one too large to count) is refused rather than rounded to 0.
  const exact = Number(m[1]) * Duration.toMillis(Duration.fromInputUnsafe(`1 ${UNIT[m[2]!]!}`))
  const ms = Math.round(exact)
  if (!Number.isSafeInteger(ms) || (ms === 0 && exact > 0)) return Option.none()
  return Option.some(Duration.millis(ms))
}

/** Formats a duration the way the config file writes it (`1500ms`, `5s`, `2m`). */
export const formatShortDuration = (d: Duration.Duration): string => {
  const ms = Duration.toMillis(d)
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`
  if (ms % 1000 === 0) return `${ms / 1000}s`
  return `${ms}ms`
}

/**
 * A duration written as a string such as `5s`. With `zeroMeans`, a zero duration is refused, and the message
 * says what 0 would do (a timer that fires at once, every time).
 */
const durationString = (zeroMeans?: string) =>
  Schema.String.pipe(
    Schema.decodeTo(
      Schema.Duration,
      SchemaTransformation.transformEffect({
        decode: (s: string) =>
          Option.match(parseShortDuration(s), {
            onNone: () =>
              Effect.fail(
                new SchemaIssue.InvalidValue(
                  { message: `expected a duration such as "500ms", "5s", "2m" or "1h", got "${s}"` },
                  s
                )
              ),
            onSome: (d) =>
              zeroMeans !== undefined && Duration.toMillis(d) === 0
                ? Effect.fail(
                    new SchemaIssue.InvalidValue(
                      { message: `expected a duration above 0 such as "5s", got "${s}": ${zeroMeans}` },
                      s
                    )
                  )
                : Effect.succeed(d)
          }),
        encode: (d: Duration.Duration) => Effect.succeed(formatShortDuration(d))
      })
    )
  )

/** A duration written as a string such as `5s`. */
export const ShortDuration = durationString()

/** A duration above 0: `zeroMeans` says what 0 would do instead. */
const PositiveDuration = (zeroMeans: string) => durationString(zeroMeans)

const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/

/** Why the host of a `host:port` names no address (brackets hold an IPv6 address, four numbers an IPv4 one), or undefined. */
const hostProblem = (host: string): string | undefined => {
  if (host.startsWith("[") && !net.isIPv6(host.slice(1, -1)))
    return `${host} is not an IPv6 address (brackets are for IPv6 only)`
  if (/^\d+\.\d+\.\d+\.\d+$/.test(host) && !net.isIPv4(host)) return `${host} is not an IPv4 address`
  return undefined
}

/** `host:port` (IPv6 in brackets); port 0 lets the OS choose, which tests use. */
export const HostPort = Schema.String.check(
  Schema.makeFilter((s) => {
    const m = HOST_PORT.exec(s)
    const expected = `expected host:port such as "0.0.0.0:7071", got "${s}"`
    if (!m) return expected
    if (Number(m[2]) > 65535) return `${expected}: the port is at most 65535`
    const why = hostProblem(m[1]!)
    return why === undefined ? undefined : `${expected}: ${why}`
  })
)

/** `advertise_addr`: a `host:port` the router can dial, so neither a wildcard host nor port 0. */
export const DialableHostPort = HostPort.check(
  Schema.makeFilter((s) => {
    if (!HOST_PORT.test(s)) return undefined // HostPort says what is wrong
    const { host, port } = splitHostPort(s)
    if (isWildcardHost(host))
      return `expected an address the router can dial, got "${s}": ${host} is every address of this host, not one; give this host's IP or DNS name`
    if (Number(port) === 0)
      return `expected an address the router can dial, got "${s}": port 0 is no port to dial; give listen_grpc's port, or leave advertise_addr unset to publish the port listen_grpc binds`
    return undefined
  })
)

/** A URL's `user:password@` replaced, for messages: a secret is never printed. */
const withoutPassword = (s: string): string => s.replace(/^([a-z][a-z0-9+.-]*:\/\/[^/?#@]*?):[^/?#@]*@/i, "$1:***@")

/** An absolute http(s) URL. */
export const HttpUrl = Schema.String.check(
  Schema.makeFilter((s) => {
    try {
      const u = new URL(s)
      if (u.protocol === "http:" || u.protocol === "https:") return undefined
    } catch {
      // fall through to the message
    }
    return `expected an http:// or https:// URL, got "${withoutPassword(s)}"`
  })
)

/** An http(s) URL without `user:password@`; `where` says where the credentials go instead. */
const HttpUrlWithoutCredentials = (where: string) =>
  HttpUrl.check(
    Schema.makeFilter((s) => {
      try {
        const u = new URL(s)
        if (u.username !== "" || u.password !== "") return `credentials do not belong in the URL; ${where}`
      } catch {
        // HttpUrl says what is wrong
      }
      return undefined
    })
  )

/** Characters an etcd key part may not hold: "/" would move the key to another place, control characters break it. */
const KEY_PART_FORBIDDEN = /[/\p{Cc}]/u

/**
 * Why `s` cannot be one part of the node's etcd key `<etcd_prefix>/<cluster.name>/nodes/<node_id>`, or undefined.
 * Exported for node_id taken from NODE_NAME or the hostname, which the schema never sees.
 */
export const keyPartProblem = (s: string): string | undefined =>
  KEY_PART_FORBIDDEN.test(s)
    ? `expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got ${JSON.stringify(s)}`
    : undefined

const KeyPart = Schema.NonEmptyString.check(Schema.makeFilter(keyPartProblem))

/** `cluster.etcd_prefix`: "/a" or "/a/b", so `<prefix>/<name>/nodes/` is one well-formed key range of its own. */
const EtcdPrefix = Schema.String.check(
  Schema.makeFilter((s) => {
    const got = `got ${JSON.stringify(s)}`
    if (!s.startsWith("/")) return `expected a key prefix starting with "/", such as "/cgn", ${got}`
    if (/^\/+$/.test(s))
      return `expected a key prefix such as "/cgn", ${got}: it would put the node keys at the root of etcd (/<name>/nodes/...), among other applications' keys`
    if (s.endsWith("/"))
      return `expected no "/" at the end (keys are <etcd_prefix>/<name>/nodes/<node_id>), ${got}; write ${JSON.stringify(s.replace(/\/+$/, ""))}`
    if (s.includes("//")) return `expected no empty part ("//"), ${got}`
    if (/\p{Cc}/u.test(s)) return `expected no control characters, ${got}`
    return undefined
  })
)

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

export const EngineKinds = ["vllm", "sglang", "llama_cpp", "mlx", "openai_compat"] as const
export type EngineKind = (typeof EngineKinds)[number]
export const KvOffloads = ["none", "nixl", "lmcache", "hicache", "kvbm"] as const
export type KvOffload = (typeof KvOffloads)[number]
export const Roles = ["prefill", "decode", "both"] as const
export type Role = (typeof Roles)[number]
export const LogLevels = ["trace", "debug", "info", "warn", "error"] as const

export const ClusterSection = Schema.Struct({
  name: withDefault(KeyPart, "default"),
  etcd: withDefault(
    Schema.Array(HttpUrlWithoutCredentials("set cluster.etcd_username and cluster.etcd_password instead")),
    []
  ),
  etcd_prefix: withDefault(EtcdPrefix, "/cgn"),
  etcd_ca_file: Schema.optionalKey(Schema.String),
  etcd_cert_file: Schema.optionalKey(Schema.String),
  etcd_key_file: Schema.optionalKey(Schema.String),
  etcd_username: Schema.optionalKey(Schema.String),
  etcd_password: Schema.optionalKey(Schema.String)
})

export const SecuritySection = Schema.Struct({
  require_mtls: withDefault(Schema.Boolean, false),
  ca_file: Schema.optionalKey(Schema.String),
  cert_file: Schema.optionalKey(Schema.String),
  key_file: Schema.optionalKey(Schema.String)
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
  health_damping: withDefault(PositiveInt, 2),
  drain_timeout: withDefault(ShortDuration, "30s"),
  handoff_timeout: withDefault(PositiveDuration("every prefill and decode leg would time out at once"), "30s"),
  state_dir: withDefault(Schema.NonEmptyString, "/var/lib/cgn-agent"),
  log_level: withDefault(Schema.Literals(LogLevels), "info"),
  admin_token: Schema.optionalKey(Schema.NonEmptyString),
  otlp_endpoint: Schema.optionalKey(HttpUrl)
})

export const EngineSection = Schema.Struct({
  kind: withDefault(Schema.Literals(EngineKinds), "vllm"),
  url: withDefault(
    HttpUrlWithoutCredentials(
      "the agent sends none to the engine (it has no engine password or API key setting): serve the engine unauthenticated where only the agent reaches it (loopback for an engine the agent spawns); secrets the engine itself needs go in engine.env"
    ),
    "http://127.0.0.1:8000"
  ),
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
  verify_listener: withDefault(Schema.Boolean, true),
  gpu_free_timeout: withDefault(ShortDuration, "2m"),
  gpu_free_below_mib: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 1024)
})

export const ModelSection = Schema.Struct({
  hf_repo: Schema.optionalKey(Schema.NonEmptyString),
  path: Schema.optionalKey(Schema.NonEmptyString),
  tp: withDefault(PositiveInt, 1),
  dp: withDefault(PositiveInt, 1),
  served_name: Schema.optionalKey(Schema.NonEmptyString),
  max_model_len: Schema.optionalKey(PositiveInt),
  gpu_memory_utilization: Schema.optionalKey(
    Schema.Number.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1))
  ),
  args: withDefault(Schema.Array(Schema.String), []),
  gpus: withDefault(
    Schema.Array(Schema.Union([Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), Schema.NonEmptyString])),
    []
  )
})

/**
 * A ZMQ endpoint of the engine's KV events: `tcp://HOST:PORT` (the port is offset by the DP rank),
 * `ipc://PATH` or `inproc://NAME`; anything else would only fail once the KV bridge opens its socket.
 */
const ZmqEndpoint = Schema.String.check(
  Schema.makeFilter((s) => {
    const expected = `expected a ZMQ endpoint such as "tcp://127.0.0.1:5557", "tcp://*:5557" or "ipc:///run/kv.sock", got ${JSON.stringify(s)}`
    const tcp = /^tcp:\/\/(\S+):(\d{1,5})$/.exec(s)
    if (tcp !== null) {
      if (Number(tcp[2]) > 65535) return `${expected}: the port is at most 65535`
      const why = hostProblem(tcp[1]!)
      return why === undefined ? undefined : `${expected}: ${why}`
    }
    return /^(ipc|inproc):\/\/\S+$/.test(s) ? undefined : expected
  })
)

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
