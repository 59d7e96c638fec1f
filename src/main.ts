#!/usr/bin/env node
/**
 * The `cgn-agent` binary: runs the CLI with Node's platform services and exits with its code.
 * Everything else lives in programs/; this file only wires the process to them.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect, Exit, Runtime } from "effect"
import { runCli, subcommands } from "./programs/cli.ts"
import { runMain } from "./programs/runMain.ts"

// `node dist/main.js --config F` (the container's command) means `run --config F`; so does
// `node dist/main.js --log-level debug --config F`.
const args = process.argv.slice(2)
const named = new Set<string>(subcommands.map((c) => c.name))
const argv = /^--(config|log-level)\b/.test(args[0] ?? "") && !args.some((a) => named.has(a)) ? ["run", ...args] : args

runMain(runCli(argv).pipe(Effect.provide(NodeServices.layer)), {
  teardown: (exit, onExit) =>
    Exit.isSuccess(exit) ? onExit(exit.value as number) : Runtime.defaultTeardown(exit, onExit)
})
