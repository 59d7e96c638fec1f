#!/usr/bin/env node
// cgn-kvcached-ref: the reference cgn-kvcached receiver (layers/kv/kvcachedReceiver.ts) as a program.
//   cgn-kvcached-ref --uds PATH [--journal FILE]
// Serves the kvcached contract on PATH; with --journal, appends every Hello and applied record to FILE
// (NDJSON) and resumes from it after a restart. Logs `{"msg":"listening"}` on stderr once the socket is up.
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Effect, Layer } from "effect"
import { layer } from "../layers/kv/kvcachedReceiver.ts"

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const path = arg("--uds")
if (path === undefined) {
  process.stderr.write("usage: cgn-kvcached-ref --uds PATH [--journal FILE]\n")
  process.exit(2)
}
const journal = arg("--journal")

// Its one log line goes to stderr, and Node ignores SIGPIPE: written after the reader closed the pipe (a log
// collector gone), it fails with EPIPE, raised a tick later as an 'error' on process.stderr that nobody heard,
// so Node threw it and the receiver died at start, exit 1, never serving. The line is dropped instead (as
// layers/observability/Logging.ts does for the agent). stdout gets Effect's log lines (a failed start, its socket
// server failed, its socket path left at exit to a newer receiver): the console does not catch that 'error' either,
// so those lines are dropped the same way.
process.stderr.on("error", () => {})
process.stdout.on("error", () => {})

const listening = Layer.effectDiscard(
  Effect.sync(() => process.stderr.write(`${JSON.stringify({ msg: "listening", uds: path })}\n`))
)

NodeRuntime.runMain(Layer.launch(listening.pipe(Layer.provideMerge(layer({ path, ...(journal ? { journal } : {}) })))))
