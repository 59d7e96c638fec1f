/**
 * What the `cgn-agent` binary runs once main.ts has checked the Node version: the CLI with Node's
 * platform services, exiting with its code.
 */
// The module itself, not the package index: the index also loads NodeRedis, which needs redis (not installed).
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, Exit, Runtime } from "effect"
import { runCli, subcommands } from "./cli.ts"
import { runMain } from "./runMain.ts"

// `node dist/main.js --config F` (the container's command) means `run --config F`; so does
// `node dist/main.js --log-level debug --config F`.
const args = process.argv.slice(2)
const named = new Set<string>(subcommands.map((c) => c.name))
const argv = /^--(config|log-level)\b/.test(args[0] ?? "") && !args.some((a) => named.has(a)) ? ["run", ...args] : args

runMain(runCli(argv).pipe(Effect.provide(NodeServices.layer)), {
  teardown: (exit, onExit) =>
    Exit.isSuccess(exit) ? onExit(exit.value as number) : Runtime.defaultTeardown(exit, onExit)
})
