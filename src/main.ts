#!/usr/bin/env node
/**
 * The `cgn-agent` binary: runs the CLI with Node's platform services and exits with its code.
 * Everything else lives in programs/; this file only wires the process to them.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect, Exit, Runtime } from "effect"
import { runCli } from "./programs/cli.ts"
import { runMain } from "./programs/runMain.ts"

// `node dist/main.js --config F` (the container's command) means `run --config F`.
const args = process.argv.slice(2)
const argv = args[0]?.startsWith("--config") ? ["run", ...args] : args

runMain(runCli(argv).pipe(Effect.provide(NodeServices.layer)), {
  teardown: (exit, onExit) =>
    Exit.isSuccess(exit) ? onExit(exit.value as number) : Runtime.defaultTeardown(exit, onExit)
})
