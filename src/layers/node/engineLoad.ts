/**
 * The engine's load signals (running and waiting requests, KV-cache usage: its Prometheus /metrics through
 * EngineClient.load), sampled by a fiber of their own in the layer's scope, so that nothing on the status path
 * (the etcd heartbeat's record, admin /status and /metrics, gRPC GetNodeHealth) ever waits on the engine's I/O.
 * A hung engine (SIGSTOPped, a wedged API server) used to hold every reader for the client's 10 s timeout, and
 * the next lease keepalive behind the heartbeat's write: a 3 s lease was lost while /status said `registered`.
 *
 * One scrape per heartbeat, start to start, while the engine is Ready, each bounded by `scrapeTimeoutMs` (0.9 of
 * a heartbeat: readers never wait on it, so it only has to end before the next is due; half a heartbeat cut a busy
 * engine's slow /metrics off exactly when its load mattered most); a new Ready period is scraped at once. Readers
 * take the last sample of the engine's current Ready period while it is at most `maxAgeMs` (three heartbeats)
 * old; older, the engine's signals count as not reported, as for an engine that does not export them.
 *
 * Logging: a failing spell starts at a failed scrape and ends only once `RECOVERED_AFTER` scrapes in a row have
 * answered, so a flapping engine logs one warning per kind of failure (`failureKind`: timeout, connect, HTTP
 * status, protocol...; the full message goes in the line's fields) and one recovery line, not two lines per two
 * heartbeats; an error text that varies (an HTTP body with a request id) does not make a new line per scrape.
 */
import { Clock, Effect, Option, Stream } from "effect"
import type { EngineError, LoadSignals } from "../../services/engine/EngineClient.ts"
import type { EngineState } from "../../services/engine/EngineProcess.ts"
import { background, type Restart } from "../observability/backgroundFiber.ts"

/** The bound of one scrape: 0.9 of a heartbeat (it ends before the next is due), at most the EngineClient's 10 s. */
export const scrapeTimeoutMs = (heartbeatMs: number): number =>
  Math.max(1, Math.min(Math.floor(heartbeatMs * 0.9), 10_000))

/** Answered scrapes in a row that end a failing spell (and log its recovery). */
export const RECOVERED_AFTER = 3

/** Kinds of failure logged per spell at most: the set stays bounded whatever the engine answers. */
const MAX_KINDS = 8

/** A failure's kind, the key it is logged once by: bounded, unlike its message (an HTTP body, an address). */
export const failureKind = (e: EngineError): string =>
  e.reason === "Http" ? `HTTP ${e.status ?? "error"}` : e.reason.toLowerCase()

/** The oldest sample a reader takes: three heartbeats (two missed scrapes and a late one). */
export const maxAgeMs = (heartbeatMs: number): number => 3 * heartbeatMs

export interface EngineLoadOptions {
  /** One scrape (EngineClient.load). Interrupted at the bound, which aborts its request. */
  readonly load: Effect.Effect<LoadSignals, EngineError>
  readonly state: Effect.Effect<EngineState>
  /** The engine's states, the current one first (SubscriptionRef.changes). */
  readonly changes: Stream.Stream<EngineState>
  readonly heartbeatMs: number
  /**
   * Each scrape of a Ready engine as it ends, at its time: the signals, or undefined when it failed (the engine's
   * progress counters go to EngineStall from here: one scrape serves both).
   */
  readonly onSample?: ((signals: LoadSignals | undefined, at: number) => Effect.Effect<void>) | undefined
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

type Outcome =
  | { readonly ok: true; readonly signals: LoadSignals }
  | { readonly ok: false; readonly kind: string; readonly reason: string }

/** Starts the sampler in the current scope; its fiber ends with the scope. */
export const sampleEngineLoad = (o: EngineLoadOptions) =>
  Effect.gen(function* () {
    const timeoutMs = scrapeTimeoutMs(o.heartbeatMs)
    const oldestMs = maxAgeMs(o.heartbeatMs)
    let sample: Sample | undefined
    let failing: string | undefined
    let scrapes = 0
    // the failing spell: the kinds logged in it (each once, however long it lasts), its failed scrapes, and the
    // answered scrapes in a row since its last failure (RECOVERED_AFTER of them end it)
    const logged = new Set<string>()
    let spell: { failures: number; answered: number } | undefined

    // Polling, not a request: no span (it would be a root span per heartbeat in every trace backend).
    const scrape: Effect.Effect<Outcome> = o.load.pipe(
      Effect.withTracerEnabled(false),
      Effect.timeoutOption(timeoutMs),
      Effect.map(
        Option.match({
          onNone: (): Outcome => ({ ok: false, kind: "timeout", reason: `no answer within ${timeoutMs} ms` }),
          onSome: (signals): Outcome => ({ ok: true, signals })
        })
      ),
      Effect.catch((e) => Effect.succeed<Outcome>({ ok: false, kind: failureKind(e), reason: e.message }))
    )

    const sampleOnce = (readySince: number) =>
      Effect.gen(function* () {
        scrapes++
        const outcome = yield* scrape
        const at = yield* Clock.currentTimeMillis
        if (o.onSample !== undefined) yield* o.onSample(outcome.ok ? outcome.signals : undefined, at)
        if (outcome.ok) {
          sample = { signals: outcome.signals, at, readySince }
          failing = undefined
          if (spell === undefined || ++spell.answered < RECOVERED_AFTER) return
          yield* Effect.logInfo("engine metrics scrape answers again", {
            failedScrapes: spell.failures,
            answeredInARow: spell.answered
          })
          spell = undefined
          logged.clear()
          return
        }
        // The last good sample stays, for readers to judge by its age.
        failing = outcome.reason
        spell = { failures: (spell?.failures ?? 0) + 1, answered: 0 }
        if (logged.has(outcome.kind) || logged.size >= MAX_KINDS) return
        logged.add(outcome.kind)
        yield* Effect.logWarning(
          `engine metrics scrape failed; the engine's load signals are left out once the last sample is older than ${oldestMs} ms`,
          { kind: outcome.kind, reason: outcome.reason }
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
          spell = undefined
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
    // A defect in a scrape (a throw parsing the engine's answer, in onSample) would end the sampling for the process:
    // the load signals left out, EngineStall without the engine's progress counters. Said, and sampled again from a
    // heartbeat on (the loop reads the engine's state afresh each time).
    const restart: Restart = { baseMs: o.heartbeatMs, capMs: Math.max(o.heartbeatMs, 60_000) }
    yield* loop.pipe(
      background("the engine metrics scrape", "the engine's load signals and progress counters are no longer sampled", {
        restart
      }),
      Effect.forkScoped
    )

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
