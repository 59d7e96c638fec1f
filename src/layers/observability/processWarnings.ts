/**
 * Node's own process warnings as log lines of the agent's shape. Node prints a warning (a DeprecationWarning such as
 * DEP0123, which grpc-js raises when TLS goes to an etcd endpoint given by IP address: grpc/grpc-node#1919) as plain
 * text on stderr, a line no JSON log reader takes. Its printer is a 'warning' listener of its own (nodejs/node
 * lib/internal/process/warning.js onWarning): for the scope it is set aside and the warning logged instead; put back
 * after.
 */
import { Effect, Layer } from "effect"

export const layer: Layer.Layer<never> = Layer.effectDiscard(
  Effect.gen(function* () {
    const run = Effect.runSyncWith(yield* Effect.context<never>())
    const onWarning = (w: Error & { readonly code?: unknown }): void => {
      try {
        run(
          Effect.logWarning(`node: ${w.message}`, {
            warning: w.name,
            ...(typeof w.code === "string" ? { code: w.code } : {})
          })
        )
      } catch {
        // a log line that cannot be written is dropped, as any (Logging.ts survivePipeLoss)
      }
    }
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const node = process.listeners("warning")
        for (const l of node) process.off("warning", l)
        process.on("warning", onWarning)
        return node
      }),
      (node) =>
        Effect.sync(() => {
          process.off("warning", onWarning)
          for (const l of node) process.on("warning", l)
        })
    )
  })
)
