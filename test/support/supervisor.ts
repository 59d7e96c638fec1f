/** Supervisor settings for tests that drive the watch or the supervisor on a TestClock; override what a test needs. */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Context, Effect, Layer, Logger, Stream } from "effect"
import { layerFromPlan } from "../../src/layers/engine/EngineProcess.ts"
import type { SupervisorSettings } from "../../src/layers/engine/supervisorSettings.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineHost, type EngineHostService } from "../../src/services/engine/EngineHost.ts"
import { EngineProcess, type EngineState } from "../../src/services/engine/EngineProcess.ts"
import { AgentShortage, type AgentShortageService } from "../../src/services/node/AgentShortage.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { makeFakeHost } from "./fakeEngineHost.ts"
import { freePort } from "./ports.ts"

export const testSettings = (overrides: Partial<SupervisorSettings> = {}): SupervisorSettings => ({
  startupTimeoutMs: 60_000,
  stopGraceMs: 500,
  livenessIntervalMs: 5_000,
  livenessFailures: 3,
  backoff: { initialMs: 1_000, maxMs: 30_000, stableAfterMs: 600_000, crashLoopAfter: 3 },
  stateDir: "/nonexistent",
  verifyListener: true,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50,
  ...overrides
})

/** A line the supervisor logged: its level ("Warn", "Info") and its message's text (without the fields). */
export interface LoggedLine {
  readonly level: string
  readonly text: string
}

/**
 * The production supervisor (layers/engine/EngineProcess.ts layerFromPlan) over `host` (a fake EngineHost: nothing
 * spawned) in the scope, for tests on a TestClock: every state it publishes and every line it logs, recorded; told of
 * its probes, `shortage` (services/node/AgentShortage.ts) when given.
 */
export const superviseFake = (
  plan: LaunchPlan,
  settings: SupervisorSettings,
  host: EngineHostService,
  shortage?: AgentShortageService
) =>
  Effect.gen(function* () {
    const lines: Array<LoggedLine> = []
    const capture = Logger.make(({ logLevel, message }) => {
      const [text] = [message].flat()
      if (typeof text === "string") lines.push({ level: logLevel, text })
    })
    const context = yield* Layer.build(
      layerFromPlan(plan, settings).pipe(
        Layer.provide(Layer.succeed(EngineHost, host)),
        Layer.provide(shortage === undefined ? Layer.empty : Layer.succeed(AgentShortage, shortage)),
        Layer.provide(Logger.layer([capture]))
      )
    )
    const engine = Context.get(context, EngineProcess)
    const states: Array<EngineState> = []
    yield* engine.changes.pipe(
      Stream.runForEach((s) => Effect.sync(() => states.push(s))),
      Effect.forkScoped
    )
    return { engine, states, lines }
  })

/**
 * superviseFake over a fresh fake host, with a state_dir of its own (removed with the scope) and a plan probing
 * `/health` on a free port: what a test of the supervisor's probes needs; `overrides` for the settings.
 */
export const superviseFakeHost = (overrides: Partial<SupervisorSettings> = {}, shortage?: AgentShortageService) =>
  Effect.gen(function* () {
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-supervise-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(stateDir, { recursive: true, force: true })))
    const port = yield* Effect.promise(freePort)
    const plan = testPlan({ port, probe: { kind: "http", url: `http://127.0.0.1:${port}/health` } })
    const fake = yield* makeFakeHost()
    const settings = testSettings({ stateDir, ...overrides })
    return { fake, settings, ...(yield* superviseFake(plan, settings, fake.host, shortage)) }
  })
