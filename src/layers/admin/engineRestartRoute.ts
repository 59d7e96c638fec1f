/**
 * `POST /engine/restart`: ends the Ready engine run (EngineProcess.restart) so that the supervisor starts a new one,
 * logged with who asked. The answers are pure in services/admin/EngineRestart.ts; the route sits behind the admin
 * server's auth gate (authGate.ts).
 */
import { Effect } from "effect"
import { ADMIN_RESTART_REASON, ENGINE_RESTART_PATH, restartAnswer } from "../../services/admin/EngineRestart.ts"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { json } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { adminRoute } from "./methods.ts"

export const engineRestartRoute = (options: { readonly guarded: Guard; readonly draining: Effect.Effect<boolean> }) =>
  Effect.map(EngineProcess, (engine) =>
    adminRoute(ENGINE_RESTART_PATH, (request) =>
      options.guarded(
        Effect.gen(function* () {
          // the drain stops the engine itself once the calls are done; a restart now would only cut them short
          const outcome = (yield* options.draining) ? "draining" : yield* engine.restart("admin", ADMIN_RESTART_REASON)
          // info, not warn: an operator's intended action, no fault (the run's end is logged at info too)
          if (outcome === "restarting") yield* Effect.logInfo(`restarting the engine: ${ADMIN_RESTART_REASON}`)
          const answer = restartAnswer(outcome, yield* engine.state)
          return json(answer.body, answer.status)
        })
      )(request)
    )
  )
