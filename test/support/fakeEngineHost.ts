/**
 * A fake EngineHost (the supervisor's one seam: services/engine/EngineHost.ts) for driving the production supervisor
 * (layers/engine/EngineProcess.ts layerFromPlan) on a TestClock with nothing spawned: each run is recorded for the
 * test to end or inspect, and the probe answers as the test's `up` says.
 */
import { Clock, Deferred, Effect, Ref } from "effect"
import {
  EngineHost,
  type EngineHostService,
  type ProbeResult,
  type RunExit
} from "../../src/services/engine/EngineHost.ts"

/** Pids no process has (above Linux's pid_max, 4194304), so the real reclaim and group checks see nothing alive. */
export const fakePid = (run: number) => 4_194_304 + 1_000 + run

/** One spawned fake run: the test ends it through `exited`; `stops` counts the supervisor's teardowns. */
export interface FakeRun {
  readonly run: number
  /** The Clock's time at its spawn, as the live host's startedAt. */
  readonly spawnedAt: number
  /** Reported at the spawn (fakePid), or by the test where `pidAtSpawn` is false. */
  readonly pid: Deferred.Deferred<number | undefined>
  readonly exited: Deferred.Deferred<RunExit>
  readonly stops: Ref.Ref<number>
  /** What `observe` said (the supervisor's state, as the test saw it) when this run's stop began. */
  readonly stateAtStop: () => string | undefined
  /** Its group's life after its stop: with `stopSurvives`, true (a group that survived SIGKILL) until the test ends it. */
  readonly alive: Ref.Ref<boolean>
}

export interface FakeHostOptions {
  /** Whether each run reports its pid at its spawn (default); false: the test reports it on `run.pid`. */
  readonly pidAtSpawn?: boolean
  /** The exit a stop ends the run with (default: ended by its SIGTERM, as the guard's TERM ends an engine). */
  readonly stopExit?: Omit<RunExit, "problem">
  /** The engine's last lines for run `run` (default none). */
  readonly lastLines?: (run: number) => ReadonlyArray<string>
  /** Runs whose stop finds their group survived SIGKILL: it stays alive until the test sets `alive` false. */
  readonly stopSurvives?: (run: number) => boolean
}

export interface FakeHost {
  readonly host: EngineHostService
  /** Every run spawned so far, in order. */
  readonly runs: Ref.Ref<ReadonlyArray<FakeRun>>
  /** The probe's answer: ok while true, else "connection refused" (waiting for port); false until the test says. */
  readonly up: Ref.Ref<boolean>
  /** Set, the probe answers this instead of what `up` says (a result no real engine gives: an unsent probe's). */
  readonly answer: Ref.Ref<ProbeResult | undefined>
  /** Set to a Deferred, a stop waits for it before it ends the run: to look at the supervisor mid-stop. */
  readonly holdStops: Ref.Ref<Deferred.Deferred<void> | undefined>
  /** Read when a run's stop begins (FakeRun.stateAtStop); the test sets it once it records states. */
  readonly seen: { observe: () => string | undefined }
}

export const makeFakeHost = (options: FakeHostOptions = {}): Effect.Effect<FakeHost> =>
  Effect.gen(function* () {
    const {
      pidAtSpawn = true,
      stopExit = { code: null, signal: "SIGTERM" },
      lastLines = () => [],
      stopSurvives = () => false
    } = options
    const runs = yield* Ref.make<ReadonlyArray<FakeRun>>([])
    const up = yield* Ref.make(false)
    const answer = yield* Ref.make<ProbeResult | undefined>(undefined)
    const holdStops = yield* Ref.make<Deferred.Deferred<void> | undefined>(undefined)
    const seen: { observe: () => string | undefined } = { observe: () => undefined }
    const host = EngineHost.of({
      spawn: (_plan, spawn) =>
        Effect.gen(function* () {
          let atStop: string | undefined
          const run: FakeRun = {
            run: spawn.run,
            spawnedAt: yield* Clock.currentTimeMillis,
            pid: yield* Deferred.make<number | undefined>(),
            exited: yield* Deferred.make<RunExit>(),
            stops: yield* Ref.make(0),
            stateAtStop: () => atStop,
            alive: yield* Ref.make(false)
          }
          if (pidAtSpawn) yield* Deferred.succeed(run.pid, fakePid(spawn.run))
          // Like the guard: a stop ends the engine on its TERM; memoized as the live stop is, so the supervisor's
          // explicit stop and the scope's release share one teardown.
          const stop = yield* Effect.cached(
            Effect.sync(() => {
              atStop ??= seen.observe()
            }).pipe(
              // a test can hold the teardown to look at the supervisor mid-stop
              Effect.andThen(Effect.flatMap(Ref.get(holdStops), (hold) => (hold ? Deferred.await(hold) : Effect.void))),
              Effect.andThen(Ref.update(run.stops, (n) => n + 1)),
              Effect.andThen(Deferred.succeed(run.exited, { ...stopExit, problem: undefined })),
              Effect.andThen(stopSurvives(spawn.run) ? Ref.set(run.alive, true) : Effect.void),
              Effect.map(() => (stopSurvives(spawn.run) ? ("survived" as const) : ("terminated" as const)))
            )
          )
          yield* Effect.addFinalizer(() => stop)
          yield* Ref.update(runs, (xs) => [...xs, run])
          return {
            startedAt: run.spawnedAt,
            guardPid: undefined,
            pid: run.pid,
            exited: run.exited,
            lastLines: Effect.succeed(lastLines(spawn.run)),
            stop,
            drainOutput: () => Effect.void,
            // no sockets: nothing to tell by, as where /proc cannot say
            portHolder: () => Effect.succeed("unknown" as const),
            groupAlive: Ref.get(run.alive)
          }
        }),
      probe: () =>
        Effect.flatMap(Ref.get(answer), (set) =>
          set !== undefined
            ? Effect.succeed(set)
            : Effect.map(Ref.get(up), (ok) =>
                ok
                  ? { ok: true as const }
                  : { ok: false as const, reason: "connection refused", phase: "waiting for port" as const }
              )
        )
    })
    return { host, runs, up, answer, holdStops, seen }
  })
