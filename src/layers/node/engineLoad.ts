/**
 * The engine's load signals (running and waiting requests, KV-cache usage: its Prometheus /metrics through
 * EngineClient.load), sampled by a fiber of their own in the layer's scope, so that nothing on the status path
 * (the etcd heartbeat's record, admin /status and /metrics, gRPC GetNodeHealth) ever waits on the engine's I/O.
 * A hung engine (SIGSTOPped, a wedged API server) used to hold every reader for the client's 10 s timeout, and
 * the next lease keepalive behind the heartbeat's write: a 3 s lease was lost while /status said `registered`.
 *
 * One scrape per heartbeat, start to start, while the engine is Ready, each bounded by `scrapeTimeoutMs` (half a
 * heartbeat: a late answer is useless to the record it was for); a new Ready period is scraped at once. Readers
 * take the last sample of the engine's current Ready period while it is at most `maxAgeMs` (three heartbeats)
 * old; older, the engine's signals count as not reported, as for an engine that does not export them. A failing
 * scrape is logged once per distinct reason while it fails, and its recovery once.
 */
import { Clock, Effect, Option, Stream } from "effect"
import type { EngineError, LoadSignals } from "../../services/engine/EngineClient.ts"
import type { EngineState } from "../../services/engine/EngineProcess.ts"

/** The bound of one scrape: half a heartbeat, at most the EngineClient's own 10 s. */
export const scrapeTimeoutMs = (heartbeatMs: number): number =>
  Math.max(1, Math.min(Math.floor(heartbeatMs / 2), 10_000))

/** The oldest sample a reader takes: three heartbeats (two missed scrapes and a late one). */
export const maxAgeMs = (heartbeatMs: number): number => 3 * heartbeatMs

export interface EngineLoadOptions {
  /** One scrape (EngineClient.load). Interrupted at the bound, which aborts its request. */
  readonly load: Effect.Effect<LoadSignals, EngineError>
  readonly state: Effect.Effect<EngineState>
  /** The engine's states, the current one first (SubscriptionRef.changes). */
  readonly changes: Stream.Stream<EngineState>
  readonly heartbeatMs: number
}

/** What the sampler knows now, for tests and status views. */
export interface EngineLoadView {
  /** How old the last sample of the current Ready period is (ms); undefined: none. */
  readonly ageMs: number | undefined
  /** Why the last scrape failed; undefined when it answered (or none was due). */
  readonly failing: string | undefined
  /** Scrapes made, answered or not. */
  readonly scrapes: number
}

export interface EngineLoad {
  /** The engine's signals for a reader that saw `state`: the last sample if fresh, else undefined. Never waits. */
  readonly latest: (state: EngineState) => Effect.Effect<LoadSignals | undefined>
  readonly view: Effect.Effect<EngineLoadView>
}

interface Sample {
  readonly signals: LoadSignals
  readonly at: number
  /** The Ready period it belongs to (Ready's `since`): a restarted or recovered engine's is not shown. */
  readonly readySince: number
}

type Outcome = { readonly ok: true; readonly signals: LoadSignals } | { readonly ok: false; readonly reason: string }

/** Starts the sampler in the current scope; its fiber ends with the scope. */
export const sampleEngineLoad = (o: EngineLoadOptions) =>
  Effect.gen(function* () {
    const timeoutMs = scrapeTimeoutMs(o.heartbeatMs)
    const oldestMs = maxAgeMs(o.heartbeatMs)
    let sample: Sample | undefined
    let failing: string | undefined
    let scrapes = 0
    // the reasons logged in this failing spell: each once, however long the engine keeps failing
    const logged = new Set<string>()

    // Polling, not a request: no span (it would be a root span per heartbeat in every trace backend).
    const scrape: Effect.Effect<Outcome> = o.load.pipe(
      Effect.withTracerEnabled(false),
      Effect.timeoutOption(timeoutMs),
      Effect.map(
        Option.match({
          onNone: (): Outcome => ({ ok: false, reason: `no answer within ${timeoutMs} ms` }),
          onSome: (signals): Outcome => ({ ok: true, signals })
        })
      ),
      Effect.catch((e) => Effect.succeed<Outcome>({ ok: false, reason: e.message }))
    )

    const sampleOnce = (readySince: number) =>
      Effect.gen(function* () {
        scrapes++
        const outcome = yield* scrape
        const at = yield* Clock.currentTimeMillis
        if (outcome.ok) {
          sample = { signals: outcome.signals, at, readySince }
          if (failing !== undefined) yield* Effect.logInfo("engine metrics scrape answers again")
          failing = undefined
          logged.clear()
          return
        }
        // The last good sample stays, for readers to judge by its age.
        failing = outcome.reason
        if (logged.has(outcome.reason)) return
        logged.add(outcome.reason)
        yield* Effect.logWarning(
          `engine metrics scrape failed; the engine's load signals are left out once the last sample is older than ${oldestMs} ms`,
          { reason: outcome.reason }
        )
      })

    const loop = Effect.gen(function* () {
      for (;;) {
        const started = yield* Clock.currentTimeMillis
        const state = yield* o.state
        const readySince = state._tag === "Ready" ? state.since : undefined
        if (readySince !== undefined) yield* sampleOnce(readySince)
        else {
          // not Ready: nothing is scraped (as before), and a failing spell ends with the Ready period
          sample = undefined
          failing = undefined
          logged.clear()
        }
        // A new Ready period (a start, a restart, a recovered probe) is sampled at once, not up to a heartbeat late.
        const newReady = o.changes.pipe(
          Stream.filter((s) => s._tag === "Ready" && s.since !== readySince),
          Stream.take(1),
          Stream.runDrain
        )
        const wait = Math.max(0, started + o.heartbeatMs - (yield* Clock.currentTimeMillis))
        yield* Effect.race(Effect.sleep(wait), newReady)
      }
    })
    yield* Effect.forkScoped(loop)

    const latest = (state: EngineState): Effect.Effect<LoadSignals | undefined> =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const s = sample
        if (state._tag !== "Ready" || s === undefined || s.readySince !== state.since) return undefined
        return now - s.at <= oldestMs ? s.signals : undefined
      })

    const view = Effect.map(
      Clock.currentTimeMillis,
      (now): EngineLoadView => ({ ageMs: sample === undefined ? undefined : now - sample.at, failing, scrapes })
    )
    return { latest, view } satisfies EngineLoad
  })
