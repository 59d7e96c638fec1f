/**
 * The live EngineStall: a SubscriptionRef written by the Generate stall watchdog, cleared when the supervisor
 * starts a new engine run (a restarted engine has not stalled).
 */
import { Effect, Layer, Stream, SubscriptionRef } from "effect"
import { EngineProcess } from "../../services/engine/EngineProcess.ts"
import { EngineStall, noStall, type StallState } from "../../services/engine/EngineStall.ts"

export const layer: Layer.Layer<EngineStall, never, EngineProcess> = Layer.effect(
  EngineStall,
  Effect.gen(function* () {
    const engine = yield* EngineProcess
    const ref = yield* SubscriptionRef.make<StallState>(noStall)
    yield* Stream.runForEach(engine.changes, (s) =>
      s._tag === "Starting" ? SubscriptionRef.set(ref, noStall) : Effect.void
    ).pipe(Effect.forkScoped)
    return EngineStall.of({
      stalled: (now) =>
        SubscriptionRef.update(ref, (s) => ({ ...s, lastStallAt: now, stalledStreams: s.stalledStreams + 1 })),
      // only a change when it clears a stall: completions alone must not wake every subscriber on each tick
      completed: (now) =>
        Effect.flatMap(SubscriptionRef.get(ref), (s) =>
          s.lastStallAt !== undefined && (s.lastCompletedAt ?? 0) <= s.lastStallAt
            ? SubscriptionRef.set(ref, { lastStallAt: s.lastStallAt, lastCompletedAt: now, stalledStreams: 0 })
            : Effect.void
        ),
      state: SubscriptionRef.get(ref),
      changes: SubscriptionRef.changes(ref)
    })
  })
)
