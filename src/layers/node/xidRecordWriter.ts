/**
 * Writes the GPU Xid record (xidMemory.ts) durably (durableFile.ts), one write at a time. A new Xid or a clear is
 * written at once; event counts alone at most every COUNT_WRITE_MS (an application Xid storm must not fsync at every
 * sample); a failed write is logged once per reason and tried again no sooner than RETRY_MS after it. A clear waits
 * for its write (`writeNow`, bounded), so that its answer says whether it outlives a restart; at the scope's end the
 * last change is written (`flush`, bounded by FLUSH_MS: a term of the shutdown bound). Background writes run detached
 * from the scope: interrupting one would leave its promise writing the same file under a later one; the flush waits
 * for it instead, within its bound, and a hung file system holds nothing past the bounds.
 */
import { Clock, Duration, Effect, Semaphore } from "effect"
import { XidRecordError } from "../../services/node/Nvml.ts"
import { writeDurably } from "./durableFile.ts"

/** Count-only changes are written at most this often. */
export const COUNT_WRITE_MS = 30_000
/** A failed write is tried again no sooner than this after it. */
const RETRY_MS = 10_000
/** How long a clear waits for its write before it is refused. */
export const CLEAR_WRITE_TIMEOUT = Duration.seconds(5)
/** How long the scope's end may wait for an in-flight write and the last change (programs/shutdownBound.ts). */
export const FLUSH_MS = 1_000

export interface RecordWriter {
  /** The ledger moved (`urgent`: a new Xid), or a sample passed (`"none"`): writes when due, in the background. */
  readonly note: (change: "none" | "counts" | "xids") => Effect.Effect<void>
  /** Writes now and waits for it (CLEAR_WRITE_TIMEOUT at most). */
  readonly writeNow: Effect.Effect<void, XidRecordError>
  /** Waits for an in-flight write and writes what is left, FLUSH_MS at most; never fails. */
  readonly flush: Effect.Effect<void>
}

const errorText = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** The writer of `file`, whose content is `text()` at each write. */
export const recordWriter = (file: string, text: () => string): RecordWriter => {
  const lock = Semaphore.makeUnsafe(1)
  let dirty = false
  let background = false
  let lastWriteAt = Number.NEGATIVE_INFINITY
  let retryAt = Number.NEGATIVE_INFINITY
  let lastFailure: string | undefined

  /** One write of the current content; a change while it runs leaves `dirty` set for the next. */
  const writeOnce = lock.withPermits(1)(
    Effect.gen(function* () {
      dirty = false
      const content = text()
      const result = yield* Effect.tryPromise(() => writeDurably(file, content)).pipe(Effect.result)
      const now = yield* Clock.currentTimeMillis
      if (result._tag === "Success") {
        lastWriteAt = now
        if (lastFailure !== undefined) yield* Effect.logInfo("GPU Xid record written again", { file })
        lastFailure = undefined
        if (result.success !== undefined) yield* Effect.logWarning(`GPU Xid record: ${result.success}`)
        return
      }
      dirty = true
      retryAt = now + RETRY_MS
      const why = errorText(result.failure.cause)
      if (why !== lastFailure) {
        yield* Effect.logWarning(`cannot write the GPU Xid record ${file}: a restart would act on an older one`, {
          error: why
        })
      }
      lastFailure = why
      return yield* new XidRecordError({ file, reason: why })
    })
  )

  const drain: Effect.Effect<void> = Effect.suspend(() =>
    dirty ? Effect.flatMap(Effect.result(writeOnce), (r) => (r._tag === "Success" ? drain : Effect.void)) : Effect.void
  ).pipe(
    Effect.ensuring(
      Effect.sync(() => {
        background = false
      })
    )
  )

  const note: RecordWriter["note"] = (change) =>
    Effect.gen(function* () {
      if (change !== "none") dirty = true
      if (!dirty || background) return
      const now = yield* Clock.currentTimeMillis
      // a new Xid is tried at once, even after a failure; counts (and a failed write's retry) wait their turn
      const due = change === "xids" || (now >= retryAt && now - lastWriteAt >= COUNT_WRITE_MS)
      if (!due) return
      background = true
      yield* Effect.forkDetach(drain)
    })

  const writeNow = Effect.suspend(() => {
    dirty = true
    return writeOnce
  }).pipe(
    Effect.timeoutOrElse({
      duration: CLEAR_WRITE_TIMEOUT,
      orElse: () =>
        Effect.fail(new XidRecordError({ file, reason: `no answer within ${Duration.format(CLEAR_WRITE_TIMEOUT)}` }))
    })
  )

  const flush = Effect.suspend(() => (dirty ? Effect.ignore(writeOnce) : lock.withPermits(1)(Effect.void))).pipe(
    Effect.timeoutOption(Duration.millis(FLUSH_MS)),
    Effect.asVoid
  )

  return { note, writeNow, flush }
}
