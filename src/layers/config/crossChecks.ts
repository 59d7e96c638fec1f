/**
 * Checks across fields of a decoded config: exactly one model with one source, keys that go together,
 * lease against heartbeat and etcd's longest lease, listeners that would share a port and ports past 65535
 * (portChecks.ts), and everything the chosen engine's capabilities refuse (roles, KV offload, parallelism, ports,
 * GPUs, served names). Pure; no I/O.
 */
import { Duration } from "effect"
import type { ConfigFile } from "../../services/config/ConfigSchema.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { splitHostPort } from "../../services/net/HostPort.ts"
import { migRefProblem } from "../../services/node/Mig.ts"
import { reporterTiming } from "../../services/registry/ReporterTiming.ts"
import { portOf } from "../engine/backends/common.ts"
import { engineOf } from "../engine/backends/index.ts"
import { listenerProblems, listeners, rankedPortProblems, sameSocket, tcpPort } from "./portChecks.ts"

/** The etcd lease's TTL: agent.lease_ttl, else 3 heartbeats. */
export const leaseTtlOf = (agent: ConfigFile["agent"]): Duration.Duration =>
  agent.lease_ttl ?? Duration.times(agent.heartbeat, 3)

/**
 * etcd's longest lease, in seconds: its lessor refuses a longer TTL (Grant returns ErrLeaseTTLTooLarge, "etcdserver:
 * too large lease TTL"), so the node would never register. MaxLeaseTTL in etcd's server/lease/lessor.go
 * (https://github.com/etcd-io/etcd/blob/main/server/lease/lessor.go).
 */
const ETCD_MAX_LEASE_TTL_S = 9_000_000_000

/**
 * The etcd client takes one scheme for all its endpoints: it throws on a mix of http:// and https:// (etcd3
 * lib/connection-pool.js hasSecureHost, "cannot be configured with a mix of secure and insecure hosts"), and once TLS
 * files give it credentials it speaks TLS to every endpoint, http:// ones too (buildAuthentication), which then never
 * connect ("disconnected before secure TLS connection was established").
 */
const etcdSchemeProblems = (cluster: ConfigFile["cluster"]): Array<string> => {
  const schemes = new Set(cluster.etcd.map((e) => e.slice(0, e.indexOf(":"))))
  if (schemes.size > 1)
    return [
      "cluster.etcd: mixes http:// and https:// endpoints, which the etcd client refuses; give every endpoint the same scheme (https:// with cluster.etcd_ca_file for TLS)"
    ]
  const tlsFile = (["etcd_ca_file", "etcd_cert_file", "etcd_key_file"] as const).find((k) => cluster[k] !== undefined)
  if (schemes.has("http") && tlsFile !== undefined)
    return [
      `cluster.${tlsFile}: set, but cluster.etcd's endpoints are http://, which the etcd client would then reach with TLS all the same and never connect; write them https://, or remove the etcd TLS files for plain HTTP`
    ]
  return []
}

/**
 * engine.env names the engine's environment can hold: not empty and without "=" (POSIX: an entry is name=value, the
 * name ending at the first "="). Node's spawn writes the entry all the same, and the engine then reads another
 * variable: `"CUDA_VISIBLE_DEVICES=7" = "x"` reaches Python as CUDA_VISIBLE_DEVICES "7=x", past the refusal of a
 * device list set by hand below. (A NUL is refused for every key: RawValues.ts.)
 */
const envNameProblems = (env: Readonly<Record<string, string>>): Array<string> =>
  Object.keys(env)
    .filter((name) => name === "" || name.includes("="))
    .map(
      (name) =>
        `${formatPath(["engine", "env", name])}: ${name === "" ? "an empty name" : 'a name with "=" in it'} is no environment variable (an entry is NAME=value, the name ending at the first "="); write the variable's name alone`
    )

/** Combinations the schema cannot see: one model, paired keys, timing, and what the engine kind can run. */
export const crossChecks = (c: ConfigFile): Array<string> => {
  const problems: Array<string> = [...envNameProblems(c.engine.env)]
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
    if (name === "")
      problems.push(
        `${at}: the table's name is the model's name (and served_name's default); give it one, such as [models."llama-3-8b"]`
      )
    if (m.hf_repo === undefined && m.path === undefined) problems.push(`${at}: set hf_repo or path`)
    if (m.hf_repo !== undefined && m.path !== undefined) problems.push(`${at}: set hf_repo or path, not both`)
  }
  if (c.security.require_mtls) {
    for (const k of ["ca_file", "cert_file", "key_file"] as const) {
      if (c.security[k] === undefined) problems.push(`security.${k}: required when security.require_mtls = true`)
    }
  } else if ((c.security.allowed_client_names ?? []).length > 0) {
    // Names of client certificates, and without mTLS there are none: the list would read as protection it is not.
    problems.push(
      "security.allowed_client_names: names client certificates, and without mTLS the gRPC server asks for none (anyone who reaches it can call); set security.require_mtls = true with ca_file, cert_file and key_file, or remove the key"
    )
  }
  const tlsKeys = [c.cluster.etcd_cert_file, c.cluster.etcd_key_file]
  if (tlsKeys.filter((k) => k !== undefined).length === 1) {
    problems.push("cluster.etcd_cert_file: etcd_cert_file and etcd_key_file go together; set both or neither")
  }
  problems.push(...etcdSchemeProblems(c.cluster))
  if ((c.cluster.etcd_username === undefined) !== (c.cluster.etcd_password === undefined)) {
    problems.push("cluster.etcd_username: etcd_username and etcd_password go together; set both or neither")
  }
  const lease = c.agent.lease_ttl
  if (lease !== undefined && Duration.isLessThanOrEqualTo(lease, c.agent.heartbeat)) {
    problems.push("agent.lease_ttl: must be longer than agent.heartbeat, or the lease expires between two heartbeats")
  }
  if (Duration.toMillis(c.agent.heartbeat) < 100) problems.push("agent.heartbeat: must be at least 100ms")
  problems.push(...leaseProblems(c))
  const both = [...new Set(c.engine.fault_xids.filter((x) => c.engine.ignore_xids.includes(x)))]
  if (both.length > 0) {
    problems.push(
      `engine.fault_xids: ${both.join(", ")} also listed in engine.ignore_xids; an Xid is either a fault or ignored: keep each in one list`
    )
  }
  problems.push(...listenerProblems(c))
  problems.push(...engineProblems(c))
  return problems
}

/**
 * A first restart delay set above the cap: every delay is capped at engine.restart_backoff_max (EngineState.ts
 * backoffDelay), so the initial value would be overruled without a word. Only when the file sets the initial delay
 * (`initialSet`): a cap set alone below the initial's 1s default asks for shorter delays, and each restart waits the cap.
 */
export const backoffOrderProblems = (c: ConfigFile, initialSet: boolean): Array<string> => {
  const { restart_backoff_initial: initial, restart_backoff_max: max } = c.engine
  if (!initialSet || !Duration.isGreaterThan(initial, max)) return []
  return [
    `engine.restart_backoff_initial: ${Duration.format(initial)} is longer than engine.restart_backoff_max (${Duration.format(max)}), which caps every delay, the first one too; set it to at most ${Duration.format(max)}, or raise restart_backoff_max`
  ]
}

/** A lease etcd would refuse (with etcd only: a standalone agent holds none), naming the key that sets its TTL. */
const leaseProblems = (c: ConfigFile): Array<string> => {
  if (c.cluster.etcd.length === 0) return []
  // in whole seconds, rounded up, as the reporter grants it
  const ttl = reporterTiming(c.agent.heartbeat, leaseTtlOf(c.agent)).ttlSeconds
  if (ttl <= ETCD_MAX_LEASE_TTL_S) return []
  const longest = `etcd's longest lease, ${ETCD_MAX_LEASE_TTL_S}s (MaxLeaseTTL): etcd refuses to grant it, so the node would never register`
  return [
    c.agent.lease_ttl !== undefined
      ? `agent.lease_ttl: ${ttl}s is longer than ${longest}`
      : `agent.heartbeat: the lease TTL (agent.lease_ttl unset: 3 x heartbeat = ${ttl}s) is longer than ${longest}; set a shorter heartbeat`
  ]
}

const engineProblems = (c: ConfigFile): Array<string> => {
  const engine = engineOf(c)
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
    problems.push(...rankedPortProblems(c, name, m.dp))
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
    if (m.gpus.length > 0) problems.push(...gpuProblems(kind, caps.cudaGpus === true, name, m))
    // The agent gates each spawn on, watches and reports the GPUs it assigns: a device list set by hand would
    // run the engine on GPUs the agent does not look at (it would watch the first healthy ones instead).
    if (caps.cudaGpus === true && c.engine.env.CUDA_VISIBLE_DEVICES !== undefined) {
      problems.push(
        `${formatPath(["engine", "env", "CUDA_VISIBLE_DEVICES"])}: the agent gives the engine its GPUs and watches those; list them as ${formatPath(["models", name, "gpus"])} (NVML indices or UUIDs) instead`
      )
    }
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
  if (caps.spawns) {
    // The port the engine is started on (listenOf's): none written is the scheme's.
    const port = portOf(url)
    if (port === 0) {
      problems.push(
        `engine.url: ${kind} is spawned by the agent on this port and probed there; port 0 would start it with --port 0 and probe port 0 until engine.startup_timeout, got "${c.engine.url}"; give a fixed port such as 8000`
      )
    }
    for (const [key, addr] of port === 0 ? [] : listeners(c)) {
      const l = splitHostPort(addr)
      const why = Number(l.port) === port ? sameSocket(url.hostname, l.host) : undefined
      if (why !== undefined) {
        problems.push(
          `engine.url: ${kind} is spawned by the agent on port ${port}, which overlaps agent.${key} = "${addr}" (${why}); the engine would fail with EADDRINUSE and be restarted again and again: give it another port`
        )
      }
    }
  }
  if (!caps.spawns && url.port === "0") {
    problems.push(
      `engine.url: ${kind} proxies a server someone else runs, and port 0 is no port it can listen on: the agent would probe port 0 for ever, got "${c.engine.url}"; give the server's port`
    )
  }
  // The kind of a server someone else runs; a spawned engine's is its own kind (the backend data says how it speaks).
  if (caps.spawns && c.engine.proxied_kind !== undefined) {
    problems.push(
      `engine.proxied_kind: says what serves engine.url for kind = "openai_compat"; ${kind} is the engine the agent starts itself, so remove it`
    )
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

/** `models.x.gpus`: one GPU per engine worker (tp x dp), each named once; a MIG device alone, for one worker. */
const gpuProblems = (
  kind: string,
  cudaGpus: boolean,
  name: string,
  m: { readonly tp: number; readonly dp: number; readonly gpus: ReadonlyArray<number | string> }
): Array<string> => {
  const key = formatPath(["models", name, "gpus"])
  if (!cudaGpus) return [`${key}: ${kind} does not run on GPUs the agent assigns; remove gpus`]
  const problems: Array<string> = []
  const needed = m.tp * m.dp
  // a MIG device is one CUDA device, and CUDA enumerates one per process: say so rather than count GPUs
  const mig = migRefProblem(m.gpus, needed)
  if (mig !== undefined) problems.push(`${key}: ${mig}`)
  else if (m.gpus.length !== needed) {
    problems.push(
      `${key}: lists ${m.gpus.length} GPU${m.gpus.length === 1 ? "" : "s"} but the engine needs tp x dp = ${needed}`
    )
  }
  const seen = new Set<string>()
  for (const g of m.gpus) {
    if (seen.has(String(g))) problems.push(`${key}: GPU ${JSON.stringify(g)} is listed twice`)
    seen.add(String(g))
  }
  return problems
}

const orList = (items: ReadonlyArray<string>): string => {
  const quoted = items.map((i) => `"${i}"`)
  return quoted.length <= 1 ? (quoted[0] ?? "") : `${quoted.slice(0, -1).join(", ")} or ${quoted.at(-1)}`
}
