/**
 * The writer of the GPU Xid record in agent.state_dir (xidMemory.ts reads it back): what the ledger holds of this
 * boot's fault Xids, so that a restarted agent keeps a faulty GPU out of the engine's set. One write at a time,
 * queued after the last; an Xid that came or went (or a clear) is written at once, a count-only change at most every
 * COUNT_WRITE_MS, a failed write retried RETRY_MS later and said once per reason, and the scope's end waits
 * FLUSH_MS at most for what is in flight (programs/shutdownBound.ts counts it).
 */
import { Clock, Duration, Effect } from "effect"
import { XidRecordError } from "../../services/node/Nvml.ts"
import { writeDurably } from "../stateDir/durableFile.ts"

/** Count-only changes are written at most this often. */
export const COUNT_WRITE_MS = 30_000
/** A failed write is tried again no sooner than this after it. */
const RETRY_MS = 10_000
/** How long a clear waits for its write before it is refused. */
export const CLEAR_WRITE_TIMEOUT = Duration.seconds(5)
/** How long the scope's end may wait for the writes in flight and the last change (programs/shutdownBound.ts). */
export const FLUSH_MS = 1_000

export interface RecordWriter {
  /** The ledger moved (`"xids"`: an Xid came or went), or a sample passed (`"none"`): writes when due. */
  readonly note: (change: "none" | "counts" | "xids") => Effect.Effect<void>
  /** Writes now and waits for it (CLEAR_WRITE_TIMEOUT at most); a failure leaves the next write due at once. */
  readonly writeNow: Effect.Effect<void, XidRecordError>
  /** Waits for the writes in flight and writes what is left, FLUSH_MS at most; never fails. */
  readonly flush: Effect.Effect<void>
}

type Outcome =
  | { readonly ok: true; readonly warning: string | undefined }
  | { readonly ok: false; readonly error: unknown }

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e))
/** What a failure is, for saying it once: the errno code (a message names the write's own temp file). */
const failureKey = (e: unknown): string => (e as NodeJS.ErrnoException)?.code ?? errorText(e)

/** The writer of `file`, whose content is `text()` at the start of each write (`writeFile`: tests slow it down). */
export const recordWriter = (
  file: string,
  text: () => string,
  writeFile: (file: string, data: string) => Promise<string | undefined> = writeDurably
): RecordWriter => {
  let chain: Promise<unknown> = Promise.resolve()
  let queued = 0
  /** The record on disk may be older than the ledger. */
  let dirty = false
  /** ... by an Xid that came or went (or a clear): written without waiting for COUNT_WRITE_MS. */
  let urgent = false
  let lastWriteAt = Number.NEGATIVE_INFINITY
  let retryAt = Number.NEGATIVE_INFINITY
  let lastFailure: string | undefined

  /** Queues one write after those queued; its promise never rejects. */
  const enqueue = (): Promise<Outcome> => {
    queued++
    const run = chain.then(async (): Promise<Outcome> => {
      dirty = false
      urgent = false
      try {
        return { ok: true, warning: await writeFile(file, text()) }
      } catch (error) {
        dirty = true
        return { ok: false, error }
      } finally {
        queued--
      }
    })
    chain = run
    return run
  }

  /** Takes in a settled write: its log line and its time; a change that came meanwhile is written next. */
  const settle = (outcome: Outcome): Effect.Effect<void> =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      if (outcome.ok) {
        lastWriteAt = now
        if (lastFailure !== undefined) yield* Effect.logInfo("GPU Xid record written again", { file })
        lastFailure = undefined
        if (outcome.warning !== undefined) yield* Effect.logWarning(`GPU Xid record: ${outcome.warning}`)
      } else {
        retryAt = now + RETRY_MS
        const key = failureKey(outcome.error)
        if (key !== lastFailure) {
          yield* Effect.logWarning(`cannot write the GPU Xid record ${file}: a restart would act on an older one`, {
            error: errorText(outcome.error)
          })
        }
        lastFailure = key
      }
      yield* note("none")
    })

  /** Starts a write, its outcome taken in by a detached fiber (however long it takes, whoever waits for it). */
  const write = Effect.suspend(() => {
    const run = enqueue()
    return Effect.as(
      Effect.forkDetach(
        Effect.flatMap(
          Effect.promise(() => run),
          settle
        )
      ),
      run
    )
  })

  const note: RecordWriter["note"] = (change) =>
    Effect.gen(function* () {
      if (change !== "none") dirty = true
      if (change === "xids") urgent = true
      if (!dirty || queued > 0) return
      const now = yield* Clock.currentTimeMillis
      // a new Xid is tried at once, even after a failure; counts (and a failed write's retry) wait their turn
      if (urgent || (now >= retryAt && now - lastWriteAt >= COUNT_WRITE_MS)) yield* write
    })

  const writeNow = Effect.gen(function* () {
    dirty = true
    urgent = true
    const run = yield* write
    const outcome = yield* Effect.promise(() => run).pipe(Effect.timeoutOption(CLEAR_WRITE_TIMEOUT))
    const failure =
      outcome._tag === "None"
        ? `no answer within ${Duration.format(CLEAR_WRITE_TIMEOUT)}`
        : outcome.value.ok
          ? undefined
          : errorText(outcome.value.error)
    if (failure === undefined) return
    // the caller undoes its change: whatever this write put down, the next one writes the ledger as it is then
    dirty = true
    urgent = true
    return yield* new XidRecordError({ file, reason: failure })
  })

  const flush = Effect.gen(function* () {
    // after the writes in flight: the ledger as it is now, if any change is not on disk yet
    if (dirty) yield* write
    const last = chain
    yield* Effect.promise(() => last)
  }).pipe(Effect.timeoutOption(Duration.millis(FLUSH_MS)), Effect.asVoid)

  return { note, writeNow, flush }
}
