/**
 * `cgn-agent run --config F`: the daemon (programs/main.ts). Also what `node dist/main.js --config F`
 * runs. A bad config (or a failed `check` preflight) exits 2 before anything starts, as plain lines; an error after
 * that is the daemon's last log line, level fatal (fatal.ts); SIGTERM, SIGINT or POST /drain drain it, exit 0. A
 * signal before it serves ends the start, exit 130, its last line saying so (fatal.ts `saidIfStoppedWhileStarting`).
 */
import { Effect, Option } from "effect"
import { Command, GlobalFlag } from "effect/cli"
import { engineOf } from "../layers/engine/backends/index.ts"
import { stateDirLine, stateDirProblem } from "../layers/stateDir/stateDirChecks.ts"
import { type AgentConfig, ConfigError } from "../services/config/Config.ts"
import { preflight } from "./check.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { logFatal, saidIfStoppedWhileStarting } from "./fatal.ts"
import { runDaemon } from "./main.ts"

/**
 * A state_dir `check` refuses on the host (a kernel filesystem, not a directory, not writable), for an engine the agent
 * spawns (its lock and pid file live there): refused here too, exit 2, instead of the daemon's fatal line and exit 1,
 * which systemd's RestartPreventExitStatus=2 would not stop. A directory that does not answer (a hung mount) is left
 * to the daemon's own bound.
 */
const stateDirRefused = (c: AgentConfig) =>
  Effect.gen(function* () {
    if (!engineOf(c).capabilities.spawns) return
    const found = yield* Effect.promise(() => stateDirProblem(c.agent.state_dir, process.cwd())).pipe(
      Effect.timeoutOption(10_000)
    )
    const problem = Option.getOrUndefined(found)
    if (problem === undefined) return
    return yield* new ConfigError({
      file: c.file ?? "<inline>",
      problems: [stateDirLine(c.agent.state_dir, problem)]
    })
  })

// The built-in `--log-level` global flag sets the CLI's own minimum level; the daemon's logger takes it
// over (it wins over CGN_LOG_LEVEL and `[agent].log_level`).
export const run = Command.make("run", { config: configFlag }, ({ config }) =>
  Effect.gen(function* () {
    const flag = Option.getOrUndefined(yield* GlobalFlag.LogLevel)
    // the config's log level once read: the level of the line a signal while starting ends with (fatal.ts)
    let configured: AgentConfig["agent"]["log_level"] | undefined
    return yield* Effect.gen(function* () {
      const resolved = yield* loadConfig(config)
      configured = resolved.agent.log_level
      yield* preflight(resolved)
      yield* stateDirRefused(resolved)
      // from here on the daemon logs JSON lines: an error that ends it is its last one (fatal.ts)
      return yield* runDaemon(resolved, flag).pipe(logFatal(resolved.agent.log_level, flag))
    }).pipe(saidIfStoppedWhileStarting(() => configured, flag))
  })
).pipe(
  Command.withDescription(
    "Run the agent: start and supervise the engine, serve gRPC and admin HTTP, register in etcd; drain on SIGTERM"
  )
)
