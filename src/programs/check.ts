/**
 * `cgn-agent check --config F`: validates the file, makes every check `run` makes before it starts anything
 * (`preflight`, which `run` calls too) and, on the host, what `run` would find only by failing once started
 * (hostChecks.ts: the engine's executable, state_dir, a KVBM tier, kv.uds's directory), then prints a short summary of what would run.
 * Every problem found fails in one ConfigError (cli.ts prints it and exits 2); nothing is started or created.
 */
import * as os from "node:os"
import * as path from "node:path"
import { Clock, Console, Duration, Effect } from "effect"
import { Command, Flag } from "effect/cli"
import { requireAdminToken } from "../layers/admin/Admin.ts"
import { exposureWarnings } from "../layers/config/exposureWarnings.ts"
import { engineOf } from "../layers/engine/backends/index.ts"
import { type CpuCacheReport, cpuCacheReport } from "../layers/engine/cpuCache.ts"
import { resolvePlan } from "../layers/engine/EnginePlan.ts"
import * as MemoryCgroupLive from "../layers/node/MemoryCgroup.ts"
import { etcdOptions, etcdTlsFiles, readEtcdTls } from "../layers/registry/etcdClient.ts"
import { stateDirRefusal } from "../layers/stateDir/ensureStateDir.ts"
import { stateDirDistrust } from "../layers/stateDir/stateFiles.ts"
import { eachFileProblem, readMaterial, readOne, securityFiles, type TlsFiles } from "../layers/tls/tlsMaterial.ts"
import { type AgentConfig, ConfigError } from "../services/config/Config.ts"
import type { LaunchPlan } from "../services/engine/Engine.ts"
import { isWildcardHost, splitHostPort } from "../services/net/HostPort.ts"
import { type CgroupVersion, formatBytes, type MemoryLimit } from "../services/node/MemoryCgroup.ts"
import { migRef } from "../services/node/Mig.ts"
import { firstExternalIpv4, type Interfaces, resolveAdvertiseAddr } from "../services/registry/Advertise.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { hostFindings } from "./hostChecks.ts"
import { nvmlWorkerEntry } from "./programPaths.ts"
import { shutdownBound } from "./shutdownBound.ts"

/**
 * The checks `run` makes before it starts anything, beyond decoding the file: the admin port is not open to
 * the network without a token, and (unless `offline`) the TLS files of [security] and [cluster] are readable,
 * parse, match and have not expired. They read the very functions the servers use (the admin layer, Tls,
 * etcdClient), so check and run cannot disagree. On the host, agent.state_dir must be the agent's own
 * (layers/stateDir/stateFiles.ts: owner the agent's user or root, writable by its owner only), as the supervisor checks
 * it again once made. All problems come back in one ConfigError.
 */
export const preflight = (c: AgentConfig, options: { readonly offline?: boolean } = {}) =>
  Effect.gen(function* () {
    const problems: Array<string> = []
    /** Runs a check; a failure is one more line of the list (and the value undefined). */
    const collect = <A, E extends { readonly message: string }>(check: Effect.Effect<A, E>) =>
      Effect.catch(check, (e: E) => Effect.sync((): A | undefined => void problems.push(e.message)))
    /** Each file's own problems (parse, expiry) on their own lines; a file not read (undefined) is skipped. */
    const eachFile = (pem: Parameters<typeof eachFileProblem>[0], files: TlsFiles) =>
      Effect.gen(function* () {
        for (const e of yield* eachFileProblem(pem, files, yield* Clock.currentTimeMillis)) problems.push(e.message)
      })
    yield* collect(requireAdminToken(c.agent))
    if (!options.offline) {
      if (c.security.require_mtls) {
        // Every unreadable file on its own line first, then every file read that does not parse or has expired
        // (a garbage certificate beside a missing key is said with it, not once the key is fixed); the checks across
        // the files (the key pair, the secure context) run only once each file is fine on its own.
        const files = securityFiles(c.security)
        const before = problems.length
        const ca = yield* collect(readOne(files.ca))
        const cert = yield* collect(readOne(files.cert))
        const key = yield* collect(readOne(files.key))
        yield* eachFile({ ca, cert, key }, files)
        if (problems.length === before) yield* collect(readMaterial(files, "serverAuth"))
      }
      if (c.cluster.etcd.length > 0) {
        // As [security]'s above: etcdOptions stops at the first unreadable or unusable file.
        const before = problems.length
        const ca = yield* collect(readEtcdTls(c.cluster, "etcd_ca_file"))
        const cert = yield* collect(readEtcdTls(c.cluster, "etcd_cert_file"))
        const key = yield* collect(readEtcdTls(c.cluster, "etcd_key_file"))
        yield* eachFile({ ca, cert, key }, etcdTlsFiles(c.cluster))
        if (problems.length === before) yield* collect(etcdOptions(c.cluster, { callTimeoutMs: 1, reconnectCapMs: 1 }))
      }
      const distrust = yield* Effect.promise(() => stateDirDistrust(c.agent.state_dir))
      if (distrust !== undefined) problems.push(stateDirRefusal(c.agent.state_dir, distrust))
    }
    if (problems.length > 0) return yield* new ConfigError({ file: c.file ?? "<inline>", problems })
  })

/**
 * KV events as `run` will treat them: the engine publishes whenever `[kv].events` is on, but the agent forwards
 * them only to a `[kv].uds` (without one, `run` logs a warning and the bridge stays off).
 */
const kvEventsSummary = (c: AgentConfig): string => {
  if (!c.kv.events) return "off"
  const to = c.kv.uds === undefined ? "not forwarded ([kv].uds is not set)" : `forwarded to ${whereIs(c.kv.uds)}`
  return `on, ${c.kv.events_endpoint}, ${to}`
}

/**
 * The engine's GPUs: as listed (a MIG device with the GPU NVML finds it on), else those NVML gave the plan on this
 * host now (`run` picks them again at start), else automatic; an engine that takes no NVIDIA GPUs from the agent (mlx,
 * openai_compat) gets none.
 */
const gpusSummary = (c: AgentConfig, plan: LaunchPlan | undefined): string => {
  if (engineOf(c).capabilities.cudaGpus !== true) return `none handed out (${c.engine.kind})`
  const mig = migRef(c.model.gpus)
  if (mig !== undefined) {
    // the board it is on, as NVML lists it now; the engine sees the MIG device alone, named as NVML names it (a name
    // of the form before R470, MIG-GPU-<uuid>/<gi>/<ci>, is handed over as MIG-<uuid>: Mig.ts assignMig)
    const on = plan?.gpus ?? []
    const visible = plan?.env.CUDA_VISIBLE_DEVICES ?? mig
    return `${mig} (a MIG device${on.length === 0 ? "" : ` on GPU ${on.join(", ")}`}; CUDA_VISIBLE_DEVICES=${visible})`
  }
  if (c.model.gpus.length > 0) return c.model.gpus.join(", ")
  if (plan?.gpus !== undefined)
    return `${plan.gpus.join(", ")} (automatic: the first tp x dp GPUs now, healthy ones first; picked again at start)`
  return "automatic (the first tp x dp healthy GPUs at start)"
}

/**
 * The address the router is given for this node, resolved as NodeStatus resolves it (services/registry/Advertise.ts),
 * and what decided it: from this process's NODE_IP and this host's interfaces (with --offline, not the node's).
 */
const advertiseSummary = (c: AgentConfig, interfaces: Interfaces): string => {
  const { advertise_addr, listen_grpc, node_ip } = c.agent
  const addr = resolveAdvertiseAddr({
    advertiseAddr: advertise_addr,
    listenGrpc: listen_grpc,
    nodeIp: node_ip,
    interfaces
  })
  if (advertise_addr !== undefined && advertise_addr !== "") return `${addr} (agent.advertise_addr)`
  const listen = splitHostPort(listen_grpc)
  const from =
    node_ip !== undefined && node_ip.trim() !== ""
      ? "NODE_IP"
      : !isWildcardHost(listen.host)
        ? "listen_grpc's host"
        : firstExternalIpv4(interfaces) !== undefined
          ? "the first external IPv4 address of this host"
          : "no external IPv4 address on this host"
  return `${addr} (${from}${listen.port === "0" ? "; port 0: the port listen_grpc binds at start" : ""})`
}

/**
 * A path as the config gives it, and where it is when relative to the working directory (run's too: under systemd
 * that is `/`, where a relative state_dir or kv.uds lands somewhere the operator did not mean).
 */
const whereIs = (p: string): string => {
  const absolute = path.resolve(p)
  return absolute === p ? absolute : `${p} (${absolute})`
}

/** The worst case of a shutdown (shutdownBound.ts), in the unit Kubernetes' terminationGracePeriodSeconds takes. */
const shutdownSummary = (c: AgentConfig): string => {
  const bound = shutdownBound(c)
  const seconds = Math.ceil(Duration.toMillis(bound) / 1000)
  return `within ${Duration.format(bound)}, every peer hung (terminationGracePeriodSeconds: at least ${seconds})`
}

/** The agent's memory cgroup as check read it on this host: its hierarchy and limit (undefined: not known). */
export interface MemoryReading {
  readonly version: CgroupVersion | undefined
  readonly limit: MemoryLimit | undefined
}

/** The memory cgroup's limit (the engine runs in the agent's cgroup: one container, one limit). */
const memorySummary = (m: MemoryReading | undefined): string => {
  if (m === undefined) return "not read (--offline)"
  if (m.version === undefined) return "unknown (no memory cgroup found)"
  if (m.limit === undefined) return `unknown (cgroup ${m.version}: the limit is unreadable)`
  return `${m.limit === "none" ? "none" : formatBytes(m.limit)} (cgroup ${m.version})`
}

/** The engine's CPU KV-cache tier as sized on this host (undefined: not read, with --offline). */
const cpuCacheSummary = (report: CpuCacheReport | undefined): string => {
  if (report === undefined) return "not read (--offline)"
  const size = report.size
  if (size === undefined) return "none"
  return size.kind === "known" ? `${formatBytes(size.bytes)} (${size.setting})` : `unknown (${size.why})`
}

/**
 * The summary `check` prints: one `key: value` line per fact an operator checks first. `plan`: the launch plan
 * resolved on this host (with NVML, it names the GPUs an automatic assignment takes); `memory`: the agent's memory
 * cgroup on this host (undefined with --offline); `cpuCache`: the engine's CPU KV-cache tier sized on this host;
 * `interfaces`: this host's network interfaces, for the advertised address when nothing else decides it.
 */
export const summarize = (
  c: AgentConfig,
  plan?: LaunchPlan,
  memory?: MemoryReading,
  cpuCache?: CpuCacheReport,
  interfaces: Interfaces = os.networkInterfaces()
): string => {
  const m = c.model
  const lines: Array<[string, string]> = [
    ["engine", `${c.engine.kind} at ${c.engine.url}`],
    ["model", `${m.name} (${m.source.kind} ${m.source.value}), served as ${m.served_name}`],
    ["tp", String(m.tp)],
    ["dp", String(m.dp)],
    ["gpus", gpusSummary(c, plan)],
    ["role", c.agent.role],
    ["kv_offload", c.engine.kv_offload],
    ["memory limit", memorySummary(memory)],
    ["cpu kv cache", cpuCacheSummary(cpuCache)],
    ["kv events", kvEventsSummary(c)],
    ["grpc", `${c.agent.listen_grpc}${c.security.require_mtls ? " (mTLS)" : ""}`],
    ["health", c.agent.listen_health === undefined ? "off" : `${c.agent.listen_health} (plaintext, health only)`],
    ["admin", c.agent.listen_admin],
    ["advertise", advertiseSummary(c, interfaces)],
    ["node id", c.agent.node_id],
    ["state dir", whereIs(c.agent.state_dir)],
    [
      "cluster",
      c.cluster.etcd.length > 0 ? `${c.cluster.name} via etcd ${c.cluster.etcd.join(", ")}` : "standalone (no etcd)"
    ],
    ["shutdown", shutdownSummary(c)]
  ]
  const width = Math.max(...lines.map(([k]) => k.length)) + 1
  return [`${c.file ?? "<inline>"}: ok`, ...lines.map(([k, v]) => `  ${`${k}:`.padEnd(width)} ${v}`)].join("\n")
}

/** The agent's memory cgroup on this host, read as the daemon reads it (layers/node/MemoryCgroup.ts). */
const readMemory: Effect.Effect<MemoryReading> = Effect.gen(function* () {
  const cgroup = yield* MemoryCgroupLive.make
  return { version: cgroup.version, limit: yield* cgroup.limit }
})

export const check = Command.make(
  "check",
  {
    config: configFlag,
    offline: Flag.Boolean("offline").pipe(
      Flag.withDescription(
        "Skip the host's checks: TLS files, GPUs, engine executable, model path, agent.state_dir (no KVBM tier only warns)"
      ),
      Flag.withDefault(false)
    )
  },
  ({ config, offline }) =>
    Effect.gen(function* () {
      const c = yield* loadConfig(config)
      // every problem at once, one ConfigError (exit 2): the preflight's, the GPUs', the host's
      const problems: Array<string> = []
      const keep = (e: ConfigError) => Effect.sync(() => void problems.push(...e.problems))
      yield* preflight(c, { offline }).pipe(Effect.catchTag("ConfigError", keep))
      // the plan too: with NVML on this host, a tp x dp it cannot hold (or a GPU it lacks) is refused here
      const plan = offline
        ? undefined
        : yield* resolvePlan(c, nvmlWorkerEntry()).pipe(
            Effect.catchTag("ConfigError", (e) => Effect.as(keep(e), undefined))
          )
      // what run would find only by failing once started: the engine's executable, state_dir, a KVBM tier
      const host = yield* hostFindings(c, plan ?? engineOf(c).render(c), { offline })
      problems.push(...host.errors)
      if (problems.length > 0) return yield* new ConfigError({ file: c.file ?? "<inline>", problems })
      const memory = offline ? undefined : yield* readMemory
      // sized as run sizes it at start (layers/engine/cpuCache.ts), from this process's environment (a container's
      // env:), the plan's and [engine].env, and a connector config file they name
      const cpuCache = plan && (yield* cpuCacheReport(plan, memory?.limit))
      yield* Console.log(summarize(c, plan, memory, cpuCache))
      // A warning, not a problem: the limit is the host's, and may be raised before the engine's cache fills.
      if (cpuCache?.warning !== undefined) yield* Console.error(`warning: ${cpuCache.warning}`)
      for (const warning of [...(plan?.warnings ?? []), ...host.warnings]) yield* Console.error(`warning: ${warning}`)
      for (const warning of exposureWarnings(c)) yield* Console.error(`warning: ${warning}`)
    })
).pipe(
  Command.withDescription(
    "Validate a config file and make every check `run` makes before starting (exit 2 with one line per problem)"
  ),
  Command.withExamples([
    { command: "cgn-agent check --config /etc/cgn-agent/agent.toml", description: "Validate on the host" },
    {
      command: "cgn-agent check --offline --config examples/prod.toml",
      description: "Validate without the host's certificate files"
    }
  ])
)
