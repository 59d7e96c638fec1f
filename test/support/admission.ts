// Admission test helpers shared by the admission tests: fibers only, no I/O.
import { Effect, Scope } from "effect"
import type { AdmissionService } from "../../src/services/grpc/Admission.ts"

/** Yield until `done` holds; fails after a bound so a broken implementation cannot hang the suite. */
export const settle = (done: Effect.Effect<boolean>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 100_000; i++) {
      if (yield* done) return
      yield* Effect.yieldNow
    }
    return yield* Effect.die(new Error("state did not settle"))
  })

/** Holds a slot until the returned scope is closed. */
export const hold = (a: AdmissionService) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Scope.provide(a.acquire, scope)
    return scope
  })
