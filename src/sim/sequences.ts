// The order in which a request's sequences produce their tokens (pure), and stop strings. One sequence for
// most requests; llama-server runs `n` per prompt, each in a slot of its own, and streams them interleaved:
// here one token of each running sequence in turn, a sequence's end right after its last token.
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
      /** A stop string ended the sequence at this token. */
      readonly stopped: boolean
      /** Tokens of the sequence so far, this one included. */
      readonly generated: number
    }
  | {
      readonly kind: "end"
      readonly index: number
      readonly reason: string
      /** The whole text (a non-streamed answer's): everything generated up to the stop string. */
      readonly content: string
      readonly generated: number
    }

/** llama.cpp common/common.h string_find_partial_stop: where `text` ends with a beginning of `stop`, if it does. */
const partialStop = (text: string, stop: string): number => {
  for (let len = Math.min(text.length, stop.length); len > 0; len--) {
    if (text.endsWith(stop.slice(0, len))) return text.length - len
  }
  return -1
}

/** One sequence's text, fed a token at a time: llama-server's process_token (tools/server/server-context.cpp). */
class StopText {
  text = ""
  private sent = 0
  private readonly stops: ReadonlyArray<string>
  constructor(stops: ReadonlyArray<string>) {
    this.stops = stops
  }

  /**
   * Adds a token: the text to send now and whether a stop string ended the sequence. A stop string is looked
   * for in the unsent text, from the token's start less the stop's length on (find_stopping_strings, full
   * stop); the text is cut where the earliest one begins. Otherwise unsent text that ends with the start of
   * a stop string is held back (partial stop), except on the sequence's end of text.
   */
  add(piece: string, eos: boolean): { readonly send: string; readonly stopped: boolean } {
    this.text += piece
    if (this.stops.length === 0) return { send: piece, stopped: false }
    const unsent = this.text.slice(this.sent)
    let cut = -1
    for (const w of this.stops) {
      const from = Math.max(0, unsent.length - (w.length + piece.length))
      const at = unsent.indexOf(w, from)
      if (at >= 0 && (cut < 0 || at < cut)) cut = at
    }
    if (cut >= 0) {
      this.text = this.text.slice(0, this.sent + cut)
      const send = this.text.slice(this.sent)
      this.sent += send.length
      return { send, stopped: true }
    }
    if (!eos && this.stops.some((w) => partialStop(unsent, w) >= 0)) return { send: "", stopped: false }
    this.sent += unsent.length
    return { send: unsent, stopped: false }
  }
}

/**
 * The events of the sequences `plans` (choices 0, 1, ... in order), with `stops` applied to each. A sequence
 * whose plan ends with "stop" ends on its end of text, which llama-server does not hold back.
 */
export function* sequenceEvents(
  plans: ReadonlyArray<Generation>,
  stops: ReadonlyArray<string>
): Generator<SeqEvent, void, undefined> {
  const state = plans.map((g) => ({ g, text: new StopText(stops), n: 0, done: g.tokens.length === 0 }))
  for (const [index, s] of state.entries()) {
    if (s.done) yield { kind: "end", index, reason: s.g.finishReason, content: "", generated: 0 }
  }
  while (state.some((s) => !s.done)) {
    for (const [index, s] of state.entries()) {
      if (s.done) continue
      const piece = s.g.tokens[s.n] ?? ""
      s.n++
      const lastOfPlan = s.n >= s.g.tokens.length
      // The end of text releases what a partial stop held back (llama-server skips that check for an EOG token).
      const { send, stopped } = s.text.add(piece, lastOfPlan && s.g.finishReason === "stop")
      const last = stopped || lastOfPlan
      yield { kind: "token", index, text: send, first: s.n === 1, last, stopped, generated: s.n }
      if (last) {
        s.done = true
        const reason = stopped ? "stop" : s.g.finishReason
        yield { kind: "end", index, reason, content: s.text.text, generated: s.n }
      }
    }
  }
}
