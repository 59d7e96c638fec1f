/** Everything the engine supervisor reads from the config, in milliseconds. */
import { Duration } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import type { BackoffPolicy } from "../../services/engine/EngineState.ts"
import { engineOf } from "./backends/index.ts"

export interface SupervisorSettings {
  readonly startupTimeoutMs: number
  readonly stopGraceMs: number
  readonly livenessIntervalMs: number
  readonly livenessFailures: number
  readonly backoff: BackoffPolicy
  /** [agent].state_dir: where the engine pid file lives. */
  readonly stateDir: string
  /** [engine].verify_listener: a readiness answer counts only from a listener of the engine's process group. */
  readonly verifyListener: boolean
  readonly probeIntervalMs: number
  readonly progressEveryMs: number
  readonly linesKept: number
}

/**
 * The restart backoff's delays: as configured for an engine the agent spawns; for a server it only proxies
 * (openai_compat, `spawns: false`), at most engine.liveness_interval: its "restart" is a new probe of a server someone
 * else runs, which the backoff would only keep from seeing that server back (a review: one back during a 10 s backoff
 * waited for its end, up to restart_backoff_max with the defaults).
 */
const backoffDelays = (config: AgentConfig): { readonly initialMs: number; readonly maxMs: number } => {
  const initialMs = Duration.toMillis(config.engine.restart_backoff_initial)
  const maxMs = Duration.toMillis(config.engine.restart_backoff_max)
  if (engineOf(config).capabilities.spawns) return { initialMs, maxMs }
  const livenessMs = Duration.toMillis(config.engine.liveness_interval)
  return { initialMs: Math.min(initialMs, livenessMs), maxMs: Math.min(maxMs, livenessMs) }
}

export const settingsFromConfig = (config: AgentConfig): SupervisorSettings => ({
  startupTimeoutMs: Duration.toMillis(config.engine.startup_timeout),
  stopGraceMs: Duration.toMillis(config.engine.stop_grace),
  livenessIntervalMs: Duration.toMillis(config.engine.liveness_interval),
  livenessFailures: config.engine.liveness_failures,
  backoff: {
    ...backoffDelays(config),
    stableAfterMs: Duration.toMillis(config.engine.restart_stable_after),
    crashLoopAfter: 3
  },
  stateDir: config.agent.state_dir,
  verifyListener: config.engine.verify_listener,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50
})
