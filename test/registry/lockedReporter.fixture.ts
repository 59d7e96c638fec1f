/**
 * Test fixture: an agent's registration as the daemon runs it, in its own process so a test can SIGKILL it: the
 * state_dir lock held first (layers/stateDir/stateLock.ts, as the engine supervisor takes it), then a HealthReporter
 * with that agent.state_dir. argv[2] is the config object as JSON (what layerFromObject takes). Prints one JSON line
 * `{"event":"registered","epoch":...}` on stdout once registered, then runs until killed.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Layer, Schedule } from "effect"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import { holdStateDir } from "../../src/layers/stateDir/stateLock.ts"
import { HealthReporter } from "../../src/services/registry/HealthReporter.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"

const raw = JSON.parse(process.argv[2] ?? "{}") as { agent: { state_dir: string } }

const main = Effect.gen(function* () {
  const reporter = yield* HealthReporter
  const status = yield* reporter.status.pipe(
    Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (st) => st.state === "registered" })
  )
  process.stdout.write(`${JSON.stringify({ event: "registered", epoch: status.epoch, key: status.key })}\n`)
  return yield* Effect.never
}).pipe(
  Effect.provide(
    healthReporterLayer.pipe(
      Layer.provide(
        Layer.mergeAll(
          layerFromObject(raw),
          nodeStatusTest({ state: "ready", advertiseAddr: "10.0.0.5:7071" }),
          Layer.effectDiscard(holdStateDir(raw.agent.state_dir))
        )
      )
    )
  )
)

NodeRuntime.runMain(main)
