/**
 * The engine's CPU KV-cache tier on this host, against the memory limit of the agent's cgroup: one path for
 * `cgn-agent check` (which prints it) and the supervisor at start (which logs it). The size comes from the
 * environment the engine really gets (engineEnvironment: the agent's own, the plan's, `[engine].env`), its argv, and
 * a config file a variable names (LMCACHE_CONFIG_FILE), read here: small and bounded, only a regular file, at most
 * MAX_CONFIG_BYTES, within READ_TIMEOUT; the pure rules are services/engine/CpuCache.ts.
 */
import * as fs from "node:fs/promises"
import * as process from "node:process"
import { Effect } from "effect"
import { type ConfigFileRead, type CpuCacheSize, cpuCacheFiles, cpuCacheSize } from "../../services/engine/CpuCache.ts"
import type { LaunchPlan } from "../../services/engine/Engine.ts"
import { engineEnvironment } from "../../services/engine/EngineEnvironment.ts"
import { cpuCacheOverLimit, type MemoryLimit } from "../../services/node/MemoryCgroup.ts"

/** A connector's config file is a few lines; one larger than this is not read (its size is then unknown). */
const MAX_CONFIG_BYTES = 64 * 1024
/** A file on a hung network mount must not hold the start up. */
const READ_TIMEOUT = "2 seconds"

const message = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** The file's text, or why not: not a regular file (a FIFO would block the read), too large, unreadable. */
const readConfigFile = (file: string): Effect.Effect<ConfigFileRead> =>
  Effect.tryPromise({
    try: async (): Promise<ConfigFileRead> => {
      const stat = await fs.stat(file)
      if (!stat.isFile()) return { error: "not a regular file" }
      if (stat.size > MAX_CONFIG_BYTES) return { error: `larger than ${MAX_CONFIG_BYTES} bytes, not read` }
      const handle = await fs.open(file, "r")
      try {
        const buffer = Buffer.alloc(MAX_CONFIG_BYTES + 1)
        const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0)
        return bytesRead > MAX_CONFIG_BYTES
          ? { error: `larger than ${MAX_CONFIG_BYTES} bytes, not read` }
          : { text: buffer.toString("utf8", 0, bytesRead) }
      } finally {
        await handle.close()
      }
    },
    catch: (e): ConfigFileRead => ({ error: message(e) })
  }).pipe(
    Effect.catch((e) => Effect.succeed(e)),
    Effect.timeoutOrElse({
      duration: READ_TIMEOUT,
      orElse: () => Effect.succeed<ConfigFileRead>({ error: `not read within ${READ_TIMEOUT}` })
    })
  )

/** The tier's size (undefined: the engine has none) and the warning when it reaches the limit. */
export interface CpuCacheReport {
  readonly size: CpuCacheSize | undefined
  readonly warning: string | undefined
}

/**
 * The plan's tier sized on this host and checked against `limit`. `agentEnv`: the agent's own environment (a
 * container's `env:`), which the engine inherits.
 */
export const cpuCacheReport = (
  plan: LaunchPlan,
  limit: MemoryLimit | undefined,
  agentEnv: Readonly<Record<string, string | undefined>> = process.env
): Effect.Effect<CpuCacheReport> =>
  Effect.gen(function* () {
    const tier = plan.cpuCache
    if (tier === undefined) return { size: undefined, warning: undefined }
    const env = engineEnvironment(agentEnv, plan.env)
    const paths = cpuCacheFiles(tier, env)
    const reads = yield* Effect.forEach(paths, (p) => Effect.map(readConfigFile(p), (r) => [p, r] as const))
    const size = cpuCacheSize(tier, { env, argv: plan.argv, files: Object.fromEntries(reads) })
    const warning = size?.kind === "known" ? cpuCacheOverLimit({ ...size, lower: tier.lower }, limit) : undefined
    return { size, warning }
  })
