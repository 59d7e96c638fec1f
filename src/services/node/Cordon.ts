/**
 * Cordon: the operator's lever to take the node out of traffic while the engine keeps running (POST /cordon,
 * POST /uncordon), for maintenance or debugging without a drain's exit and the model load after it. New Generate
 * calls are refused, in-flight ones finish, the engine stays supervised and the etcd lease stays; NodeHealth.state
 * says "cordoned". The cordon is the operator's intent, so it outlives the process: a record in agent.state_dir
 * (layers/node/Cordon.ts) is written before the state changes and read at start.
 * The decisions (the reason's validation, the record's shape) are pure here; `make` is the one state machine, over
 * a `CordonStore` (the file in the live layer; nothing in src/testing/Cordon.ts, for tests).
 */
import { Clock, Context, Effect, PubSub, Ref, Result, Schema, Semaphore, Stream } from "effect"

/** Why and since when the node is cordoned. */
export interface CordonRecord {
  /** Epoch milliseconds (Effect's Clock). */
  readonly since: number
  /** The operator's words; "" when none was given. */
  readonly reason: string
}

/** The longest reason kept: one log line and one /status field, not a document. */
export const MAX_REASON_LENGTH = 256

/** The POST /cordon body is not `{"reason": "..."}` with a short printable reason. */
export class CordonReasonInvalid extends Schema.TaggedError<CordonReasonInvalid>()("CordonReasonInvalid", {
  detail: Schema.String
}) {
  override get message(): string {
    return `invalid cordon body: ${this.detail}`
  }
}

/** The cordon record could not be written or removed: the cordon did not change (the answer says so, 500). */
export class CordonPersistError extends Schema.TaggedError<CordonPersistError>()("CordonPersistError", {
  file: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `cannot persist the cordon in ${this.file}: ${this.reason}; the cordon is unchanged (check agent.state_dir)`
  }
}

// C0 and C1 control characters and DEL: a reason goes into log lines and JSON that people read in a terminal. Also the
// format characters (Cf: bidi overrides such as U+202E, zero-width spaces), which change what a reader of /status or an
// alert sees without being seen themselves; and a lone surrogate (Cs), no character at all.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]|\p{Cf}|\p{Cs}/u

/** The reason of a POST /cordon body (empty body: no reason); trimmed, at most MAX_REASON_LENGTH, printable. */
export const parseCordonBody = (text: string): Result.Result<string, CordonReasonInvalid> => {
  if (text.trim() === "") return Result.succeed("")
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return Result.fail(new CordonReasonInvalid({ detail: 'not JSON; send {"reason": "..."} or no body' }))
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return Result.fail(new CordonReasonInvalid({ detail: 'not a JSON object; send {"reason": "..."}' }))
  }
  const reason = (body as { readonly reason?: unknown }).reason
  if (reason === undefined) return Result.succeed("")
  return validateReason(reason)
}

/** A reason as kept: a string, trimmed, at most MAX_REASON_LENGTH characters, no control characters. */
export const validateReason = (reason: unknown): Result.Result<string, CordonReasonInvalid> => {
  if (typeof reason !== "string") return Result.fail(new CordonReasonInvalid({ detail: "reason must be a string" }))
  const trimmed = reason.trim()
  if ([...trimmed].length > MAX_REASON_LENGTH) {
    return Result.fail(new CordonReasonInvalid({ detail: `reason longer than ${MAX_REASON_LENGTH} characters` }))
  }
  if (CONTROL.test(trimmed)) {
    return Result.fail(
      new CordonReasonInvalid({
        detail:
          "reason has control or format characters (newlines, tabs, escapes, bidi overrides, zero-width spaces, lone surrogates)"
      })
    )
  }
  return Result.succeed(trimmed)
}

/** The record as the file holds it (and /status shows it): the time as ISO 8601. */
export const encodeRecord = (r: CordonRecord): string =>
  `${JSON.stringify({ since: new Date(r.since).toISOString(), reason: r.reason })}\n`

/** The record in a file's text, or undefined when the text is not one (the caller decides what that means). */
export const decodeRecord = (text: string): CordonRecord | undefined => {
  try {
    const v = JSON.parse(text) as { readonly since?: unknown; readonly reason?: unknown }
    const since = typeof v.since === "string" ? Date.parse(v.since) : Number.NaN
    if (Number.isNaN(since)) return undefined
    const reason = Result.getOrUndefined(validateReason(v.reason ?? ""))
    return reason === undefined ? undefined : { since, reason }
  } catch {
    return undefined
  }
}

/** /status's `cordon` section. */
export const cordonView = (r: CordonRecord | undefined) =>
  r === undefined ? null : { since: new Date(r.since).toISOString(), reason: r.reason }

/** Where the cordon outlives the process. Each call settles before the in-memory state changes. */
export interface CordonStore {
  readonly write: (record: CordonRecord) => Effect.Effect<void, CordonPersistError>
  readonly remove: Effect.Effect<void, CordonPersistError>
}

export interface CordonService {
  /** The cordon now, or undefined. */
  readonly current: Effect.Effect<CordonRecord | undefined>
  /** Whether the node is cordoned now. */
  readonly cordoned: Effect.Effect<boolean>
  /**
   * The same, read without an effect: for the per-call refusal, which must see a cordon as soon as POST /cordon has
   * answered (the change streams that health follows arrive a moment later).
   */
  readonly isCordoned: () => boolean
  /**
   * Cordons (persisted first); idempotent: a cordoned node answers `already: true` and keeps its record, but for a
   * new reason (not empty), which replaces the old one (persisted first too), its `since` kept.
   */
  readonly cordon: (
    reason: string
  ) => Effect.Effect<{ readonly already: boolean; readonly record: CordonRecord }, CordonPersistError>
  /** Uncordons (the record removed first); idempotent: `was: false` when it was not cordoned. */
  readonly uncordon: Effect.Effect<{ readonly was: boolean }, CordonPersistError>
  /** Emits the new flag on every change, so NodeStatus and gRPC health follow at once. */
  readonly changes: Stream.Stream<boolean>
}

export class Cordon extends Context.Service<Cordon, CordonService>()("cgn-agent/Cordon") {}

/** The cordon state machine over a store; one change at a time, so the file and the memory never disagree. */
export const make = (initial: CordonRecord | undefined, store: CordonStore): Effect.Effect<CordonService> =>
  Effect.gen(function* () {
    const state = yield* Ref.make(initial)
    // mirrors `state` for isCordoned: written with it, under the lock
    let cordonedNow = initial !== undefined
    const lock = yield* Semaphore.make(1)
    const pubsub = yield* PubSub.unbounded<boolean>()
    const cordon = (reason: string) =>
      Effect.gen(function* () {
        const now = yield* Ref.get(state)
        // cordoned already: a new reason replaces the old (the operator's latest word), the time it began stays
        if (now !== undefined && (reason === "" || reason === now.reason)) return { already: true, record: now }
        if (now !== undefined) {
          const record: CordonRecord = { since: now.since, reason }
          yield* store.write(record)
          yield* Ref.set(state, record)
          return { already: true, record }
        }
        const record: CordonRecord = { since: yield* Clock.currentTimeMillis, reason }
        yield* store.write(record)
        yield* Ref.set(state, record)
        cordonedNow = true
        yield* PubSub.publish(pubsub, true)
        return { already: false, record }
      }).pipe(Semaphore.withPermit(lock))
    const uncordon = Effect.gen(function* () {
      if ((yield* Ref.get(state)) === undefined) return { was: false }
      yield* store.remove
      yield* Ref.set(state, undefined)
      cordonedNow = false
      yield* PubSub.publish(pubsub, false)
      return { was: true }
    }).pipe(Semaphore.withPermit(lock))
    return Cordon.of({
      current: Ref.get(state),
      cordoned: Effect.map(Ref.get(state), (r) => r !== undefined),
      isCordoned: () => cordonedNow,
      cordon,
      uncordon,
      changes: Stream.fromPubSub(pubsub)
    })
  })
