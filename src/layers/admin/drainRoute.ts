/**
 * `POST /drain`: begins the node's drain (services/node/Drain.ts; the order it runs in is programs/main.ts's) and
 * answers 202 at once, saying whether a drain had begun already. Behind the auth gate (authGate.ts).
 */
import { Effect } from "effect"
import { Drain } from "../../services/node/Drain.ts"
import { NodeStatus } from "../../services/node/NodeStatus.ts"
import { json } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { adminRoute } from "./methods.ts"

export const drainRoute = (options: { readonly guarded: Guard }) =>
  Effect.gen(function* () {
    const status = yield* NodeStatus
    const drain = yield* Drain
    return adminRoute(
      "/drain",
      options.guarded(
        Effect.gen(function* () {
          // the lever's own answer decides (atomic for two requests at once), and a drain the node status
          // already shows counts as begun (read before the start, which would show it)
          const shown = yield* status.draining
          const began = yield* drain.start
          return json({ draining: true, alreadyDraining: shown || !began }, 202)
        })
      )
    )
  })
