/** A Cordon for tests: the live state machine over a store that keeps nothing (no state_dir, no file). */
import { Effect, Layer } from "effect"
import { Cordon, make } from "../services/node/Cordon.ts"

/** Not persisted: each build starts uncordoned. */
export const layerMemory: Layer.Layer<Cordon> = Layer.effect(
  Cordon,
  Effect.suspend(() => make(undefined, { write: () => Effect.void, remove: Effect.void }))
)
