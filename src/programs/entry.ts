/**
 * What the `cgn-agent` binary runs once main.ts has checked the Node version: the CLI with Node's
 * platform services, exiting with its code.
 */
// The module itself, not the package index: the index also loads NodeRedis, which needs redis (not installed).
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, Exit, Runtime } from "effect"
import { runCli } from "./cli.ts"
import { runMain } from "./runMain.ts"

// `node dist/main.js --config F` (the container's command) means `run --config F`.
const args = process.argv.slice(2)
const argv = args[0]?.startsWith("--config") ? ["run", ...args] : args

runMain(runCli(argv).pipe(Effect.provide(NodeServices.layer)), {
  teardown: (exit, onExit) =>
    Exit.isSuccess(exit) ? onExit(exit.value as number) : Runtime.defaultTeardown(exit, onExit)
})
