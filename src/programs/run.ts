/**
 * `cgn-agent run --config F`: the daemon (programs/main.ts). Also what `node dist/main.js --config F`
 * runs. A bad config (or a failed `check` preflight) exits 2 before anything starts; SIGTERM, SIGINT or POST /drain drain it, exit 0.
 */
import { Effect, Option } from "effect"
import { Command, GlobalFlag } from "effect/cli"
import { preflight } from "./check.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { runDaemon } from "./main.ts"

// The built-in `--log-level` global flag sets the CLI's own minimum level; the daemon's logger takes it
// over (it wins over CGN_LOG_LEVEL and `[agent].log_level`).
export const run = Command.make("run", { config: configFlag }, ({ config }) =>
  Effect.gen(function* () {
    const level = yield* GlobalFlag.LogLevel
    const resolved = yield* loadConfig(config)
    yield* preflight(resolved)
    return yield* runDaemon(resolved, Option.getOrUndefined(level))
  })
).pipe(
  Command.withDescription(
    "Run the agent: start and supervise the engine, serve gRPC and admin HTTP, register in etcd; drain on SIGTERM"
  )
)
