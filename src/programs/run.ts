/**
 * `cgn-agent run --config F`: the daemon (programs/main.ts). Also what `node dist/main.js --config F`
 * runs. A bad config (or a failed `check` preflight) exits 2 before anything starts; SIGTERM, SIGINT or POST /drain drain it, exit 0.
 */
import { Effect } from "effect"
import { Command } from "effect/cli"
import { preflight } from "./check.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { runDaemon } from "./main.ts"

export const run = Command.make("run", { config: configFlag }, ({ config }) =>
  Effect.flatMap(loadConfig(config), (c) => Effect.andThen(preflight(c), runDaemon(c)))
).pipe(
  Command.withDescription(
    "Run the agent: start and supervise the engine, serve gRPC and admin HTTP, register in etcd; drain on SIGTERM"
  )
)
