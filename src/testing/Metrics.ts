/** Metrics for tests: a fresh registry with the agent's series only (no process metrics, no timers). */
import { Effect, Layer } from "effect"
import { Registry } from "prom-client"
import { fromRegistry } from "../layers/observability/Metrics.ts"
import { Metrics } from "../services/observability/Metrics.ts"

/** A fresh, empty registry per layer build, so a test can assert exact series. */
export const layerTest: Layer.Layer<Metrics> = Layer.effect(
  Metrics,
  Effect.suspend(() => fromRegistry(new Registry()))
)
