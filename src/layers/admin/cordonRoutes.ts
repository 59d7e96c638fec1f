/**
 * `POST /cordon` (an optional `{"reason": "..."}` body, read through body.ts) and `POST /uncordon`: the node out of
 * traffic with its engine kept, and back (services/node/Cordon.ts: the reason's check and the one state machine; the
 * live record in state_dir, layers/node/Cordon.ts). Both answer 202 once the record holds the change; a record that
 * cannot be written changes nothing. An uncordon under a drain is refused: a drain is final. Behind the auth gate
 * (authGate.ts); error statuses from services/admin/AdminAnswers.ts.
 */
import { Effect, Result } from "effect"
import { Cordon, cordonView, parseCordonBody } from "../../services/node/Cordon.ts"
import { json, refuse } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { withBody } from "./body.ts"
import { adminRoute } from "./methods.ts"

export const cordonRoutes = (options: { readonly guarded: Guard; readonly draining: Effect.Effect<boolean> }) =>
  Effect.map(
    Cordon,
    (cordon) =>
      [
        adminRoute("/cordon", (request) =>
          options.guarded(
            withBody((text) =>
              Effect.gen(function* () {
                const reason = parseCordonBody(text)
                if (Result.isFailure(reason)) return refuse(reason.failure._tag, reason.failure.message)
                const before = yield* cordon.current
                const done = yield* cordon.cordon(reason.success)
                if (!done.already) {
                  yield* Effect.logWarning("cordoned: new Generate calls are refused until POST /uncordon", {
                    reason: done.record.reason
                  })
                } else if (before !== undefined && before.reason !== done.record.reason) {
                  yield* Effect.logInfo("cordon reason changed", { was: before.reason, reason: done.record.reason })
                }
                return json({ cordoned: true, alreadyCordoned: done.already, cordon: cordonView(done.record) }, 202)
              }).pipe(Effect.catchTag("CordonPersistError", (e) => Effect.succeed(refuse(e._tag, e.message))))
            )(request)
          )(request)
        ),
        adminRoute("/uncordon", (request) =>
          options.guarded(
            Effect.gen(function* () {
              // a drain is final: uncordoning under it would promise a return to traffic that cannot happen
              if (yield* options.draining)
                return refuse("NodeDraining", "the node is draining; a drain cannot be undone")
              const done = yield* cordon.uncordon
              if (done.was) yield* Effect.logInfo("uncordoned: the node takes new Generate calls when ready")
              return json({ cordoned: false, wasCordoned: done.was }, 202)
            }).pipe(Effect.catchTag("CordonPersistError", (e) => Effect.succeed(refuse(e._tag, e.message))))
          )(request)
        )
      ] as const
  )
