/** Everything the engine supervisor reads from the config, in milliseconds. */
import { Duration } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import type { BackoffPolicy } from "../../services/engine/EngineState.ts"

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

export const settingsFromConfig = (config: AgentConfig): SupervisorSettings => ({
  startupTimeoutMs: Duration.toMillis(config.engine.startup_timeout),
  stopGraceMs: Duration.toMillis(config.engine.stop_grace),
  livenessIntervalMs: Duration.toMillis(config.engine.liveness_interval),
  livenessFailures: config.engine.liveness_failures,
  backoff: {
    initialMs: Duration.toMillis(config.engine.restart_backoff_initial),
    maxMs: Duration.toMillis(config.engine.restart_backoff_max),
    stableAfterMs: Duration.toMillis(config.engine.restart_stable_after),
    crashLoopAfter: 3
  },
  stateDir: config.agent.state_dir,
  verifyListener: config.engine.verify_listener,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50
})
