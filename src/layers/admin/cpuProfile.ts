/**
 * `POST /debug/cpu-profile?seconds=N[&interval_us=U]`: a V8 CPU profile of the agent's main thread, taken on
 * demand through the inspector protocol (node:inspector/promises, the same Profiler domain Chrome DevTools
 * drives), so an operator sees where a busy agent's CPU goes without restarting it with `--cpu-prof`. Answers
 * the `.cpuprofile` JSON as an attachment. One profile at a time (409 otherwise). The inspector session is a
 * scoped resource: however the request ends (the profile taken, the client gone, the agent shutting down) the
 * profiler is stopped and the session disconnected, and the sleep between start and stop is interruptible, so
 * a shutdown waits for none of the N seconds. The query and the file name are pure in
 * services/admin/CpuProfile.ts, the error statuses in services/admin/AdminAnswers.ts; the route sits behind the admin
 * server's own auth gate (authGate.ts).
 */
import type { Session } from "node:inspector/promises" // types only: the module is loaded on the first profile
import { Clock, Data, Duration, Effect, Option, Result, Semaphore } from "effect"
import { HttpServerResponse } from "effect/http"
import {
  CPU_PROFILE_PATH,
  type CpuProfileRequest,
  cpuProfileDisposition,
  cpuProfileFileName,
  parseCpuProfileQuery
} from "../../services/admin/CpuProfile.ts"
import { refuse } from "./answer.ts"
import type { Guard } from "./authGate.ts"
import { adminRoute } from "./methods.ts"

/** A step of the inspector protocol failed (or this Node has no inspector: built `--without-inspector`). */
class InspectorError extends Data.TaggedError("InspectorError")<{ readonly step: string; readonly cause: unknown }> {
  override get message(): string {
    return `CPU profile: ${this.step} failed: ${this.cause instanceof Error ? this.cause.message : String(this.cause)}`
  }
}

const step = <A>(name: string, run: () => Promise<A>) =>
  Effect.tryPromise({ try: run, catch: (cause) => new InspectorError({ step: name, cause }) })

/**
 * A session on this thread's inspector. Loaded here, not imported: an agent that is never profiled does not
 * load node:inspector. Released by Profiler.disable, which stops a profile still recording without building
 * its JSON (v8/src/inspector/v8-profiler-agent-impl.cc `disable`), then disconnect, which ends the session in
 * V8 either way; neither can fail the release (after a failed connect there is nothing to undo).
 */
const openSession = Effect.acquireRelease(
  Effect.try({
    try: () => {
      const session = new (process.getBuiltinModule("node:inspector/promises").Session)()
      session.connect()
      return session
    },
    catch: (cause) => new InspectorError({ step: "connecting to the inspector", cause })
  }),
  (session) =>
    Effect.promise(() => session.post("Profiler.disable").catch(() => undefined)).pipe(
      Effect.andThen(Effect.sync(() => session.disconnect()))
    )
)

/** Records for `seconds` and answers the profile (`nodes`, `samples`, `timeDeltas`, start and end in µs). */
const record = (request: CpuProfileRequest) =>
  Effect.scoped(
    Effect.gen(function* () {
      const session: Session = yield* openSession
      yield* step("Profiler.enable", () => session.post("Profiler.enable"))
      const interval = request.intervalUs
      if (interval !== undefined) {
        yield* step("Profiler.setSamplingInterval", () => session.post("Profiler.setSamplingInterval", { interval }))
      }
      yield* step("Profiler.start", () => session.post("Profiler.start"))
      yield* Effect.sleep(Duration.seconds(request.seconds))
      // V8 builds and serializes the whole profile here, on the main thread: the one burst a profile costs.
      const { profile } = yield* step("Profiler.stop", () => session.post("Profiler.stop"))
      return profile
    })
  )

/**
 * The route, for the admin router. `nodeId` names the file. Its lock is made here, so it is one per admin
 * server: the agent has one.
 */
export const cpuProfileRoute = (options: { readonly guarded: Guard; readonly nodeId: string }) =>
  Effect.map(Semaphore.make(1), (lock) =>
    adminRoute(CPU_PROFILE_PATH, (request) =>
      options.guarded(
        Effect.gen(function* () {
          // request.url is the path and query as received; the base only lets URL parse it
          const query = parseCpuProfileQuery(new URL(request.url, "http://admin").search)
          if (Result.isFailure(query)) return refuse("InvalidQuery", query.failure)
          const { seconds, intervalUs } = query.success
          const startedAt = yield* Clock.currentTimeMillis
          const taken = yield* lock.withPermitsIfAvailable(1)(
            Effect.logInfo("CPU profile started", { seconds, intervalUs: intervalUs ?? "V8 default" }).pipe(
              Effect.andThen(record(query.success)),
              Effect.onInterrupt(() =>
                Effect.logInfo("CPU profile abandoned (the client went away or the agent is stopping)")
              )
            )
          )
          if (Option.isNone(taken)) {
            return refuse("ProfileBusy", "a CPU profile is already being taken; try again when it ends")
          }
          const body = JSON.stringify(taken.value)
          yield* Effect.logInfo("CPU profile taken", { seconds, bytes: body.length })
          return HttpServerResponse.text(body, {
            contentType: "application/json",
            headers: {
              "content-disposition": cpuProfileDisposition(cpuProfileFileName(options.nodeId, startedAt)),
              "cache-control": "no-store"
            }
          })
        }).pipe(
          Effect.catchTag("InspectorError", (e) =>
            Effect.logWarning(e.message).pipe(Effect.as(refuse(e._tag, e.message)))
          )
        )
      )(request)
    )
  )
