/**
 * `POST /gpus/clear-xids[?gpu=N|UUID]`: forgets the Xids kept for the boot of one GPU (or all) once the operator has
 * reset it, so that its engine can start again without an agent restart, which no longer forgets them
 * (layers/node/xidMemory.ts). Answers what was cleared once the record in state_dir holds it; 404 for a GPU the host
 * does not have, 409 for one that cannot be named by UUID now, 500 (nothing cleared) when the record cannot be
 * written (the statuses from services/admin/AdminAnswers.ts). The query is pure in services/admin/ClearXids.ts; the
 * route sits behind the admin server's auth gate (authGate.ts).
 */
import { Effect, Result } from "effect"
import { CLEAR_XIDS_PATH, parseClearXidsQuery } from "../../services/admin/ClearXids.ts"
import { Nvml } from "../../services/node/Nvml.ts"
import { describeXid } from "../../services/node/Xid.ts"
import { json, refuse } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { adminRoute } from "./methods.ts"

export const clearXidsRoute = (options: { readonly guarded: Guard }) =>
  Effect.map(Nvml, (nvml) =>
    adminRoute(CLEAR_XIDS_PATH, (request) =>
      options.guarded(
        Effect.gen(function* () {
          // request.url is the path and query as received; the base only lets URL parse it
          const gpu = parseClearXidsQuery(new URL(request.url, "http://admin").search)
          if (Result.isFailure(gpu)) return refuse("InvalidQuery", gpu.failure)
          const cleared = yield* nvml.clearXids(gpu.success)
          return json(
            {
              cleared: cleared.map((c) => ({
                gpu: c.index ?? null,
                uuid: c.uuid,
                xids: c.xids.map((x) => ({ ...x, name: describeXid(x.xid) }))
              }))
            },
            200
          )
        }).pipe(
          Effect.catchTags({
            UnknownGpu: (e) => Effect.succeed(refuse(e._tag, e.message)),
            // the GPU is there but cannot be named now: the same request may succeed later, or by UUID
            GpuNotIdentified: (e) => Effect.succeed(refuse(e._tag, e.message)),
            // nothing cleared: a clear the disk does not hold would come back at the next restart
            XidRecordError: (e) => Effect.succeed(refuse(e._tag, `${e.message}; nothing was cleared`))
          })
        )
      )(request)
    )
  )
