/**
 * `GET /status`: the node's health (NodeHealth as its proto JSON), the cordon, the engine's state, pid, restarts and
 * past runs (services/admin/Admin.ts `exitForensics`), and the extra sections the program adds (`registration`), each
 * read per request; an extra that fails shows its cause in its place. Behind the auth gate (authGate.ts).
 */
import { Cause, Effect } from "effect"
import { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import { exitForensics, type StatusExtras } from "../../services/admin/Admin.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { Cordon, cordonView } from "../../services/node/Cordon.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import { json } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { adminRoute } from "./methods.ts"

export const statusRoute = (options: { readonly guarded: Guard; readonly extras: StatusExtras | undefined }) =>
  Effect.gen(function* () {
    const status = yield* NodeStatus
    const engine = yield* EngineProcess
    const cordon = yield* Cordon

    const extras = Effect.forEach(
      Object.entries(options.extras ?? {}),
      ([name, get]) =>
        get.pipe(
          Effect.catchCause((cause) => Effect.succeed({ error: Cause.pretty(cause) })),
          Effect.map((value) => [name, value] as const)
        ),
      { concurrency: "unbounded" }
    )

    const statusBody = Effect.gen(function* () {
      const [health, state, pid, restarts, exits, more, cordoned] = yield* Effect.all(
        [status.snapshot, engine.state, engine.pid, engine.restarts, engine.exits, extras, cordon.current],
        { concurrency: "unbounded" }
      )
      return {
        ...Object.fromEntries(more),
        health: NodeHealth.toJSON(health),
        cordon: cordonView(cordoned),
        engine: { state, pid: pid ?? null, restarts, exits: exits.map(exitForensics) }
      }
    })

    return adminRoute("/status", options.guarded(Effect.map(statusBody, (body) => json(body))))
  })
