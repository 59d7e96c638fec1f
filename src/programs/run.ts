/**
 * `cgn-agent run --config F`: the daemon (programs/main.ts). Also what `node dist/main.js --config F`
 * runs. A bad config (or a failed `check` preflight) exits 2 before anything starts, as plain lines; an error after
 * that is the daemon's last log line, level fatal (fatal.ts); SIGTERM, SIGINT or POST /drain drain it, exit 0.
 */
import { Effect, Option } from "effect"
import { Command, GlobalFlag } from "effect/cli"
import { preflight } from "./check.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { logFatal } from "./fatal.ts"
import { runDaemon } from "./main.ts"

// The built-in `--log-level` global flag sets the CLI's own minimum level; the daemon's logger takes it
// over (it wins over CGN_LOG_LEVEL and `[agent].log_level`).
export const run = Command.make("run", { config: configFlag }, ({ config }) =>
  Effect.gen(function* () {
    const level = yield* GlobalFlag.LogLevel
    const resolved = yield* loadConfig(config)
    yield* preflight(resolved)
    const flag = Option.getOrUndefined(level)
    // from here on the daemon logs JSON lines: an error that ends it is its last one (fatal.ts)
    return yield* runDaemon(resolved, flag).pipe(logFatal(resolved.agent.log_level, flag))
  })
).pipe(
  Command.withDescription(
    "Run the agent: start and supervise the engine, serve gRPC and admin HTTP, register in etcd; drain on SIGTERM"
  )
)
