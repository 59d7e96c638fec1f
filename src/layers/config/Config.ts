/**
 * Config layers: read the TOML file, decode it with ConfigSchema, resolve defaults and refuse
 * combinations no engine can run. Pure `decodeConfig` does all checks; the layers only add I/O.
 * Nothing half-parsed escapes: either every check passes or a ConfigError lists every problem.
 */
import * as fs from "node:fs/promises"
import * as os from "node:os"
import { Duration, Effect, Layer, Result, Schema, SchemaIssue } from "effect"
import { parse as parseToml, TomlError } from "smol-toml"
import { type AgentConfig, Config, ConfigError, type ModelConfig } from "../../services/config/Config.ts"
import {
  AgentSection,
  ClusterSection,
  ConfigFile,
  EngineSection,
  KvSection,
  knownKeys,
  ModelSection,
  SecuritySection
} from "../../services/config/ConfigSchema.ts"
import { engineFor } from "../engine/backends/index.ts"

/** Decodes TOML text into the resolved config, or every problem found, one line each. */
export const decodeConfig = (
  text: string,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  let raw: unknown
  try {
    raw = parseToml(text)
  } catch (e) {
    if (e instanceof TomlError) {
      const first = e.message.split("\n")[0] ?? e.message
      return Result.fail(new ConfigError({ file: name, problems: [`line ${e.line}, column ${e.column}: ${first}`] }))
    }
    throw e
  }
  return decodeConfigObject(raw, file, env)
}

/** Decodes an already-parsed object (the test layer and embedders use this). */
export const decodeConfigObject = (
  raw: unknown,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  const fail = (problems: ReadonlyArray<string>) =>
    Result.fail(new ConfigError({ file: name, problems: [...problems] }))
  const unknown = unknownKeyProblems(raw)
  const decoded = Schema.decodeUnknownExit(ConfigFile)(raw, { errors: "all" })
  if (decoded._tag === "Failure") return fail([...unknown, ...fieldProblems(raw)])
  if (unknown.length > 0) return fail(unknown)
  const parsed = decoded.value
  const problems = crossChecks(parsed)
  if (problems.length > 0) return fail(problems)
  return Result.succeed(resolve(parsed, file, env))
}

// Internal

const sectionSchemas = {
  cluster: ClusterSection,
  security: SecuritySection,
  agent: AgentSection,
  engine: EngineSection,
  kv: KvSection
} as const satisfies Record<string, Schema.Struct<Schema.Struct.Fields>>
const SECTIONS = Object.keys(sectionSchemas) as ReadonlyArray<keyof typeof sectionSchemas>

const isTable = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

const quoteKey = (k: string) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k))

/** Formats a schema path the way TOML writes it: `agent.heartbeat`, `models."llama-3".tp`. */
export const formatPath = (path: ReadonlyArray<PropertyKey>): string => {
  if (path.length === 0) return "<root>"
  return path
    .map((p, i) => {
      if (typeof p === "number") return `[${p}]`
      const s = String(p)
      if (i === 1 && path[0] === "models") return JSON.stringify(s)
      return quoteKey(s)
    })
    .join(".")
    .replace(/\.\[/g, "[")
}

const levenshtein = (a: string, b: string): number => {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i)
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]!
    row[0] = i
    for (let j = 1; j <= b.length; j++) {
      const cur = row[j]!
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1))
      prev = cur
    }
  }
  return row[b.length]!
}

const suggestion = (key: string, valid: ReadonlyArray<string>): string => {
  let best: string | undefined
  let bestDistance = Number.POSITIVE_INFINITY
  for (const v of valid) {
    const d = levenshtein(key, v)
    if (d < bestDistance) {
      best = v
      bestDistance = d
    }
  }
  if (best !== undefined && bestDistance <= Math.max(2, Math.floor(key.length / 3))) return `; did you mean "${best}"?`
  return `; valid keys: ${valid.join(", ")}`
}

const unknownIn = (table: Record<string, unknown>, prefix: ReadonlyArray<string>, valid: ReadonlyArray<string>) =>
  Object.keys(table)
    .filter((k) => !valid.includes(k))
    .map((k) => `${formatPath([...prefix, k])}: unknown key${suggestion(k, valid)}`)

const unknownKeyProblems = (raw: unknown): Array<string> => {
  if (!isTable(raw)) return []
  const problems = unknownIn(raw, [], knownKeys[""]!)
  for (const s of SECTIONS) {
    const t = raw[s]
    if (isTable(t)) problems.push(...unknownIn(t, [s], knownKeys[s]!))
  }
  const models = raw.models
  if (isTable(models)) {
    for (const [m, t] of Object.entries(models)) {
      if (isTable(t)) problems.push(...unknownIn(t, ["models", m], knownKeys.model!))
    }
  }
  return problems
}

const valueAt = (raw: unknown, path: ReadonlyArray<PropertyKey>): unknown =>
  path.reduce<unknown>(
    (v, k) => (isTable(v) || Array.isArray(v) ? (v as Record<PropertyKey, unknown>)[k] : undefined),
    raw
  )

/**
 * Names a TOML value in an error. Never String() an object: smol-toml's tables have a null prototype,
 * so String() throws on a table and on any array holding one (`[[agent]]`, `A = [{ b = 1 }]`).
 */
const describe = (v: unknown): string => {
  if (typeof v === "string") return JSON.stringify(v)
  if (v instanceof Date) return "a date-time"
  if (Array.isArray(v)) return v.length > 0 && v.every(isTable) ? "an array of tables" : "an array"
  if (isTable(v)) return "a table"
  if (typeof v === "number" || typeof v === "boolean" || typeof v === "bigint") return String(v)
  return typeof v
}

/** Problems of one schema against one value, each prefixed with where the value sits in the file. */
const schemaProblems = (
  schema: Schema.Top,
  value: unknown,
  at: ReadonlyArray<PropertyKey>,
  key: ReadonlyArray<PropertyKey> = at
): Array<string> => {
  const exit = Schema.decodeUnknownExit(schema as Schema.Codec<unknown, unknown>)(value, { errors: "all" })
  if (exit._tag === "Success") return []
  const reason = exit.cause.reasons.find((r) => r._tag === "Fail")
  // A defect in a transformation has no issue path: name the key being checked and what it held.
  if (reason === undefined)
    return [`${formatPath(key)}: cannot decode ${describe(valueAt(value, key.slice(at.length)))}`]
  const std = SchemaIssue.makeFormatterStandardSchemaV1()((reason.error as Schema.SchemaError).issue)
  return std.issues.map((i) => {
    const path = [...at, ...(i.path ?? []).map((p) => (typeof p === "object" && p !== null ? p.key : p))]
    // A non-empty array reports its empty form as a missing element 0.
    if (i.message === "Missing key" && path.at(-1) === 0)
      return `${formatPath(path.slice(0, -1))}: expected a non-empty list`
    const got = i.message.startsWith("Expected") ? `, got ${describe(valueAt(value, path.slice(at.length)))}` : ""
    return `${formatPath(path)}: ${i.message}${got}`
  })
}

/**
 * Decodes key by key: a struct stops at its first failing transformation (a bad duration hides a bad
 * enum next to it), so each key is checked on its own to report every problem of the file at once.
 */
const fieldProblems = (raw: unknown): Array<string> => {
  if (!isTable(raw)) return ["<root>: expected a TOML document"]
  const problems: Array<string> = []
  const byField = (struct: Schema.Struct<Schema.Struct.Fields>, table: unknown, at: ReadonlyArray<string>) => {
    if (table === undefined) return
    if (!isTable(table)) {
      const hint = Array.isArray(table) ? ` (write [${formatPath(at)}], not [[${formatPath(at)}]])` : ""
      problems.push(`${formatPath(at)}: expected a table, got ${describe(table)}${hint}`)
      return
    }
    for (const [k, field] of Object.entries(struct.fields)) {
      if (!(k in table)) continue
      problems.push(...schemaProblems(Schema.Struct({ [k]: field }), { [k]: table[k] }, at, [...at, k]))
    }
  }
  for (const s of SECTIONS) byField(sectionSchemas[s], raw[s], [s])
  const models = raw.models
  if (models !== undefined && !isTable(models)) problems.push(`models: expected tables such as [models."name"]`)
  if (isTable(models)) for (const [m, t] of Object.entries(models)) byField(ModelSection, t, ["models", m])
  return problems.length > 0 ? problems : schemaProblems(ConfigFile, raw, [])
}

const crossChecks = (c: ConfigFile): Array<string> => {
  const problems: Array<string> = []
  const models = Object.entries(c.models)
  if (models.length === 0) {
    problems.push(`models: no model configured; add one table such as [models."llama-3-8b"] with hf_repo or path`)
  } else if (models.length > 1) {
    problems.push(
      `models: ${models.length} models configured (${models.map(([n]) => JSON.stringify(n)).join(", ")}); this version serves exactly one [models."name"] table per agent`
    )
  }
  for (const [name, m] of models) {
    const at = formatPath(["models", name])
    if (m.hf_repo === undefined && m.path === undefined) problems.push(`${at}: set hf_repo or path`)
    if (m.hf_repo !== undefined && m.path !== undefined) problems.push(`${at}: set hf_repo or path, not both`)
  }
  if (c.security.require_mtls) {
    for (const k of ["ca_file", "cert_file", "key_file"] as const) {
      if (c.security[k] === undefined) problems.push(`security.${k}: required when security.require_mtls = true`)
    }
  }
  const tlsKeys = [c.cluster.etcd_cert_file, c.cluster.etcd_key_file]
  if (tlsKeys.filter((k) => k !== undefined).length === 1) {
    problems.push("cluster.etcd_cert_file: etcd_cert_file and etcd_key_file go together; set both or neither")
  }
  if ((c.cluster.etcd_username === undefined) !== (c.cluster.etcd_password === undefined)) {
    problems.push("cluster.etcd_username: etcd_username and etcd_password go together; set both or neither")
  }
  const lease = c.agent.lease_ttl
  if (lease !== undefined && Duration.isLessThanOrEqualTo(lease, c.agent.heartbeat)) {
    problems.push("agent.lease_ttl: must be longer than agent.heartbeat, or the lease expires between two heartbeats")
  }
  if (Duration.toMillis(c.agent.heartbeat) < 100) problems.push("agent.heartbeat: must be at least 100ms")
  problems.push(...engineProblems(c))
  return problems
}

const engineProblems = (c: ConfigFile): Array<string> => {
  const engine = engineFor(c.engine.kind)
  const caps = engine.capabilities
  const problems: Array<string> = []
  const kind = c.engine.kind
  if (!caps.kvOffloads.includes(c.engine.kv_offload)) {
    problems.push(
      `engine.kv_offload: ${kind} does not support "${c.engine.kv_offload}"; ${kind} supports ${caps.kvOffloads.map((o) => `"${o}"`).join(", ")}`
    )
  }
  if (!caps.roles.includes(c.agent.role)) {
    problems.push(
      `agent.role: ${kind} cannot run role "${c.agent.role}" (no prefill/decode disaggregation); ${kind} supports ${caps.roles.map((r) => `"${r}"`).join(", ")}`
    )
  }
  const byRole = caps.roleKvOffloads?.[c.agent.role]
  if (
    byRole !== undefined &&
    caps.kvOffloads.includes(c.engine.kv_offload) &&
    !byRole.kvOffloads.includes(c.engine.kv_offload)
  ) {
    problems.push(
      `engine.kv_offload: ${kind} with agent.role = "${c.agent.role}" needs kv_offload ${orList(byRole.kvOffloads)}, got "${c.engine.kv_offload}" (${byRole.why})`
    )
  }
  if (c.kv.events && !caps.kvEvents) {
    problems.push(`kv.events: ${kind} does not publish KV-cache events; set kv.events = false`)
  }
  for (const [name, m] of Object.entries(c.models)) {
    if (m.tp > 1 && !caps.tensorParallel) {
      problems.push(`${formatPath(["models", name, "tp"])}: ${kind} has no tensor parallelism; set tp = 1`)
    }
    if (m.dp > 1 && caps.dataParallel !== true) {
      problems.push(`${formatPath(["models", name, "dp"])}: ${kind} has no data parallelism; set dp = 1`)
    }
    // Each DP rank publishes on the endpoint's TCP port + rank (or inproc name + _dp<rank>); ipc cannot be offset.
    if (m.dp > 1 && c.kv.events && c.kv.events_endpoint.startsWith("ipc://")) {
      problems.push(
        `${formatPath(["models", name, "dp"])}: with dp > 1 every rank publishes KV events on kv.events_endpoint's TCP port + rank; an ipc:// endpoint cannot be offset, use tcp://`
      )
    }
    // Rank r binds (or the agent binds) events port + r and the engine binds replay port + r: the ranges must not meet.
    const events = tcpPort(c.kv.events_endpoint)
    const replay = c.kv.replay_endpoint === undefined ? undefined : tcpPort(c.kv.replay_endpoint)
    if (
      c.kv.events &&
      events !== undefined &&
      replay !== undefined &&
      events < replay + m.dp &&
      replay < events + m.dp
    ) {
      problems.push(
        `kv.replay_endpoint: with ${formatPath(["models", name, "dp"])} = ${m.dp} the KV events use ports ${events}-${events + m.dp - 1} and replay ports ${replay}-${replay + m.dp - 1}; they overlap, move replay_endpoint to port ${events + m.dp} or above`
      )
    }
    for (const k of ["max_model_len", "gpu_memory_utilization"] as const) {
      if (m[k] !== undefined && caps.modelSettings !== undefined && !caps.modelSettings.includes(k)) {
        problems.push(`${formatPath(["models", name, k])}: ${kind} has no command-line setting for ${k}; remove it`)
      }
    }
    const served = m.served_name ?? name
    const forbidden = [...(caps.servedNameForbids?.chars ?? "")].filter((ch) => served.includes(ch))
    if (forbidden.length > 0) {
      const key = m.served_name !== undefined ? ["models", name, "served_name"] : ["models", name]
      problems.push(
        `${formatPath(key)}: ${kind} cannot serve the name "${served}": it contains ${forbidden.map((ch) => `"${ch}"`).join(", ")} (${caps.servedNameForbids?.why}); set a served_name without it`
      )
    }
    if (m.gpus.length > 0) problems.push(...gpuProblems(kind, caps.cudaGpus === true, name, m, c.engine.env))
    if (!caps.spawns && m.args.length > 0) {
      problems.push(
        `${formatPath(["models", name, "args"])}: ${kind} starts nothing, so args are never used; remove them`
      )
    }
    for (const s of ["hf_repo", "path"] as const) {
      if (m[s] !== undefined && !caps.sources.includes(s)) {
        problems.push(
          `${formatPath(["models", name, s])}: ${kind} cannot load from ${s}; use ${caps.sources.join(" or ")}`
        )
      }
    }
  }
  const url = new URL(c.engine.url) // already a valid http(s) URL (schema)
  if (url.pathname !== "/" || url.search !== "") {
    problems.push(
      `engine.url: give the engine's server root (scheme, host, port), not a path: the agent adds /v1/... itself; got "${c.engine.url}"`
    )
  }
  if (caps.spawns && url.protocol === "https:") {
    problems.push(`engine.url: ${kind} is spawned by the agent and serves plain HTTP on its host:port; use http://`)
  }
  if (!caps.spawns && c.engine.command !== undefined) {
    problems.push(`engine.command: ${kind} proxies engine.url and starts nothing; remove engine.command`)
  }
  if (!caps.spawns && c.engine.args.length > 0) {
    problems.push(`engine.args: ${kind} proxies engine.url and starts nothing; remove engine.args`)
  }
  if (!caps.spawns && Object.keys(c.engine.env).length > 0) {
    problems.push(`engine.env: ${kind} proxies engine.url and starts nothing; remove engine.env`)
  }
  for (const k of ["kvbm_cpu_cache_gb", "kvbm_disk_cache_gb"] as const) {
    if (c.engine[k] !== undefined && c.engine.kv_offload !== "kvbm") {
      problems.push(`engine.${k}: sizes a KVBM cache tier, used only with engine.kv_offload = "kvbm"; remove it`)
    }
  }
  return problems
}

/** `models.x.gpus`: one GPU per engine worker (tp x dp), each named once, and not also set by hand. */
const gpuProblems = (
  kind: string,
  cudaGpus: boolean,
  name: string,
  m: { readonly tp: number; readonly dp: number; readonly gpus: ReadonlyArray<number | string> },
  env: Readonly<Record<string, string>>
): Array<string> => {
  const key = formatPath(["models", name, "gpus"])
  if (!cudaGpus) return [`${key}: ${kind} does not run on GPUs the agent assigns; remove gpus`]
  const problems: Array<string> = []
  const needed = m.tp * m.dp
  if (m.gpus.length !== needed) {
    problems.push(`${key}: lists ${m.gpus.length} GPUs but the engine needs tp x dp = ${needed}`)
  }
  const seen = new Set<string>()
  for (const g of m.gpus) {
    if (seen.has(String(g))) problems.push(`${key}: GPU ${JSON.stringify(g)} is listed twice`)
    seen.add(String(g))
  }
  if (env.CUDA_VISIBLE_DEVICES !== undefined) {
    problems.push(`${key}: engine.env sets CUDA_VISIBLE_DEVICES too; give the GPUs in one place (gpus)`)
  }
  return problems
}

/** The port of a `tcp://host:port` ZMQ endpoint, else undefined. */
const tcpPort = (endpoint: string): number | undefined => {
  const m = /^tcp:\/\/.*:(\d+)$/.exec(endpoint)
  return m === null ? undefined : Number(m[1])
}

const orList = (items: ReadonlyArray<string>): string => {
  const quoted = items.map((i) => `"${i}"`)
  return quoted.length <= 1 ? (quoted[0] ?? "") : `${quoted.slice(0, -1).join(", ")} or ${quoted.at(-1)}`
}

const resolve = (c: ConfigFile, file: string | undefined, env: Readonly<Record<string, string | undefined>>) => {
  const [name, m] = Object.entries(c.models)[0]!
  const model: ModelConfig = {
    name,
    source: m.hf_repo !== undefined ? { kind: "hf_repo", value: m.hf_repo } : { kind: "path", value: m.path! },
    tp: m.tp,
    dp: m.dp,
    served_name: m.served_name ?? name,
    max_model_len: m.max_model_len,
    gpu_memory_utilization: m.gpu_memory_utilization,
    args: m.args,
    gpus: m.gpus
  }
  const config: AgentConfig = {
    file,
    cluster: c.cluster,
    security: c.security,
    agent: {
      ...c.agent,
      node_id: c.agent.node_id ?? (env.NODE_NAME || os.hostname()),
      lease_ttl: c.agent.lease_ttl ?? Duration.times(c.agent.heartbeat, 3),
      // A token is a secret: Kubernetes hands it over as an env var from a Secret, not in the ConfigMap.
      ...(c.agent.admin_token === undefined && env.CGN_AGENT_ADMIN_TOKEN
        ? { admin_token: env.CGN_AGENT_ADMIN_TOKEN }
        : {})
    },
    engine: c.engine,
    model,
    kv: c.kv
  }
  return config
}

/** Where the config file is: `--config PATH` in argv, else CGN_AGENT_CONFIG. */
export const configPathFrom = (
  argv: ReadonlyArray<string>,
  env: Readonly<Record<string, string | undefined>>
): string | undefined => {
  const i = argv.indexOf("--config")
  if (i >= 0 && argv[i + 1] !== undefined) return argv[i + 1]
  const eq = argv.find((a) => a.startsWith("--config="))
  if (eq !== undefined) return eq.slice("--config=".length)
  return env.CGN_AGENT_CONFIG || undefined
}

/** Reads and decodes a config file. */
export const loadConfigFile = (file: string): Effect.Effect<AgentConfig, ConfigError> =>
  Effect.tryPromise({
    try: () => fs.readFile(file, "utf8"),
    catch: (e) => new ConfigError({ file, problems: [`cannot read file: ${(e as Error).message}`] })
  }).pipe(
    Effect.flatMap((text) =>
      Result.match(decodeConfig(text, file), { onFailure: Effect.fail, onSuccess: Effect.succeed })
    )
  )

/** The live layer: the file named by `--config` or CGN_AGENT_CONFIG. */
export const layerFile = (file: string): Layer.Layer<Config, ConfigError> => Layer.effect(Config, loadConfigFile(file))

/** The test layer: a config built from an object, validated exactly like a file. */
export const layerFromObject = (raw: unknown): Layer.Layer<Config, ConfigError> =>
  Layer.effect(
    Config,
    Result.match(decodeConfigObject(raw, undefined), { onFailure: Effect.fail, onSuccess: Effect.succeed })
  )
