// The order in which a request's sequences produce their tokens (pure), and stop strings. One sequence for
// most requests; llama-server runs `n` per prompt, each in a slot of its own, and streams them interleaved:
// here one token of each running sequence in turn, a sequence's end right after its last token: a round is one
// decode step, which gives each sequence it found running a token (update_slots batches every busy slot; a task
// that takes its slot meanwhile starts at the next). A sequence runs only while it holds its slot (SeqGate:
// requestSlots.ts); while none of them does, a `wait`. A sequence that takes its slot is told (`begin`) before the
// next step, its prompt evaluated or not: llama-server sends a task's begin then (server-context.cpp update_slots,
// SLOT_STATE_STARTED: send_partial_response with is_begin), before the prompt's decode.
// Each sequence's text goes through its engine's stop-string matcher (stopRules.ts; llama-server's is LlamaStops
// below).
import type { StopMatcher, TokenAt } from "./stopRules.ts"
import type { Generation } from "./tokens.ts"

export type SeqEvent =
  | {
      readonly kind: "token"
      readonly index: number
      /** The text to send for it: less than the token when a stop string cuts it or may be starting. */
      readonly text: string
      readonly first: boolean
      /** The sequence's last token (it ends next). */
      readonly last: boolean
      /** The last token of its decode step: the next comes an inter-token latency later. */
      readonly stepEnd: boolean
      /** A stop string ended the sequence at this token. */
      readonly stopped: boolean
      /** Tokens of the sequence so far, this one included. */
      readonly generated: number
    }
  | {
      readonly kind: "end"
      readonly index: number
      readonly reason: string
      /** The stop string that ended it, if one did. */
      readonly matched: string | undefined
      /** The whole text (a non-streamed answer's): everything generated up to the stop string. */
      readonly content: string
      /** Text the engine held back until the end, for its finish chunk. */
      readonly rest: string
      /** Tokens the engine counts in its usage. */
      readonly generated: number
    }
  /** None of the sequences left holds a slot: the next event comes once `until` resolves. */
  | { readonly kind: "wait"; readonly until: Promise<void> }
  /** Sequence `index` took its slot (SeqGate.holding), since the events began. */
  | { readonly kind: "begin"; readonly index: number }

/** Which sequences may run: each holds a slot from its first token to its end (requestSlots.ts). */
export interface SeqGate {
  /** Whether sequence `index` holds its slot now. */
  holds(index: number): boolean
  /**
   * Resolves when the next sequence waiting for a slot takes it (holding() grows), or, once taken, makes tokens
   * (holds it: its prompt evaluated).
   */
  next(): Promise<void>
  /** How many sequences, from the first on, have taken their slots (their tasks begun). */
  holding?(): number
  /** A decode step begins. */
  step?(): void
  /** Sequence `index` has made a token, `piece`. */
  token(index: number, piece: string): void
  /** Sequence `index` has ended: its slot is free. */
  ended(index: number): void
}

/** llama.cpp common/common.h string_find_partial_stop: where `text` ends with a beginning of `stop`, if it does. */
const partialStop = (text: string, stop: string): number => {
  for (let len = Math.min(text.length, stop.length); len > 0; len--) {
    if (text.endsWith(stop.slice(0, len))) return text.length - len
  }
  return -1
}

/** One sequence's text, fed a token at a time: llama-server's process_token (tools/server/server-context.cpp). */
export class LlamaStops implements StopMatcher {
  /** The generated text, which stop strings are looked for in. */
  private generated = ""
  readonly uncounted = 0
  private sent = 0
  private readonly stops: ReadonlyArray<string>
  /** Sent ahead of the first token and part of the answer's text, never matched nor counted (a chat's prefill). */
  private readonly prefix: string
  private sentPrefix = false
  constructor(stops: ReadonlyArray<string>, prefix = "") {
    this.stops = stops
    this.prefix = prefix
  }

  get text(): string {
    return this.prefix + this.generated
  }

  add(piece: string, at: TokenAt): { readonly send: string; readonly matched?: string | undefined } {
    const step = this.addGenerated(piece, at)
    if (this.sentPrefix) return step
    this.sentPrefix = true
    return { ...step, send: this.prefix + step.send }
  }

  /**
   * Adds a token: the text to send now and the stop string that ended the sequence, if one did. A stop string is
   * looked for in the unsent text, from the token's start less the stop's length on (find_stopping_strings, full
   * stop); the text is cut where the earliest one begins. Otherwise unsent text that ends with the start of
   * a stop string is held back (partial stop), except on the sequence's end of text (llama-server skips that
   * check for an EOG token).
   */
  private addGenerated(piece: string, at: TokenAt): { readonly send: string; readonly matched?: string | undefined } {
    this.generated += piece
    if (this.stops.length === 0) return { send: piece }
    const unsent = this.generated.slice(this.sent)
    let cut = -1
    let matched: string | undefined
    for (const w of this.stops) {
      const from = Math.max(0, unsent.length - (w.length + piece.length))
      const found = unsent.indexOf(w, from)
      if (found >= 0 && (cut < 0 || found < cut)) {
        cut = found
        matched = w
      }
    }
    if (cut >= 0) {
      this.generated = this.generated.slice(0, this.sent + cut)
      const send = this.generated.slice(this.sent)
      this.sent += send.length
      return { send, matched }
    }
    if (!at.eos && this.stops.some((w) => partialStop(unsent, w) >= 0)) return { send: "" }
    this.sent += unsent.length
    return { send: unsent }
  }

  /** What a partial stop held when the sequence ran out of tokens is not sent. */
  rest(): string {
    return ""
  }
}

/**
 * The events of the sequences `plans` (choices 0, 1, ... in order), each through a matcher of its own: from
 * `stops`, or llama-server's for a list of stop strings. A sequence whose plan ends with "stop" ends on its end
 * of text (the end-of-sequence token right after its last word): a stop string met on that word still wins.
 */
export function* sequenceEvents(
  plans: ReadonlyArray<Generation>,
  stops: ReadonlyArray<string> | (() => StopMatcher),
  gate?: SeqGate
): Generator<SeqEvent, void, undefined> {
  const matcher = typeof stops === "function" ? stops : () => new LlamaStops(stops)
  const state = plans.map((g) => ({ g, text: matcher(), n: 0, done: g.tokens.length === 0 }))
  const holds = (index: number) => gate === undefined || gate.holds(index)
  // the sequences that took their slots since last looked (those holding them as the events began aside)
  let begun = gate?.holding?.() ?? plans.length
  const taken = (): Array<SeqEvent> => {
    const from = begun
    begun = Math.max(begun, gate?.holding?.() ?? begun)
    return Array.from({ length: begun - from }, (_, i) => ({ kind: "begin", index: from + i }))
  }
  for (const [index, s] of state.entries()) {
    if (s.done) {
      gate?.ended(index)
      yield { kind: "end", index, reason: s.g.finishReason, matched: undefined, content: "", rest: "", generated: 0 }
    }
  }
  while (state.some((s) => !s.done)) {
    yield* taken()
    if (gate !== undefined && !state.some((s, index) => !s.done && holds(index))) {
      yield { kind: "wait", until: gate.next() }
      continue
    }
    gate?.step?.()
    const running = [...state.keys()].filter((index) => !state[index]?.done && holds(index))
    for (const index of running) {
      const s = state[index] as (typeof state)[number]
      const piece = s.g.tokens[s.n] ?? ""
      s.n++
      const lastOfPlan = s.n >= s.g.tokens.length
      const at = {
        last: lastOfPlan,
        eos: lastOfPlan && s.g.finishReason === "stop",
        cap: lastOfPlan && s.g.finishReason === "length"
      }
      gate?.token(index, piece)
      const { send, matched } = s.text.add(piece, at)
      const stopped = matched !== undefined
      const last = stopped || lastOfPlan
      const stepEnd = index === running.at(-1)
      yield { kind: "token", index, text: send, first: s.n === 1, last, stopped, stepEnd, generated: s.n }
      if (last) {
        s.done = true
        const reason = stopped ? "stop" : s.g.finishReason
        const content = s.text.text
        const generated = s.n - s.text.uncounted
        // the slot is free at the sequence's last token (server_slot::release, then the next task: pop_deferred_task)
        gate?.ended(index)
        yield { kind: "end", index, reason, matched, content, rest: s.text.rest(), generated }
      }
    }
  }
}
