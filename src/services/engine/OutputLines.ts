/**
 * The engine's output, as lines the agent logs and keeps for /status: split as Node's readline splits them (at "\n",
 * "\r" and "\r\n": a progress bar redrawn with "\r" is one line per redraw), but with each line bounded, and how
 * many are logged (OutputBudget). What a line shows, scrubbed of the run's secrets, is ShownLine.ts's. Pure; the run's
 * pumps (layers/engine/run.ts) feed it decoded text.
 *
 * Bounded: readline keeps a line until its end, so an engine that printed 560 MiB with no newline (a binary dump, a
 * bug) ended the agent with an uncaught `RangeError: Invalid string length` from readline, and 400 MiB cost 2.7 GB of
 * memory (a security re-check). Now a line is cut at MAX_LINE_CHARS: its head is logged at once with a marker, the
 * rest dropped up to the line's end.
 */

/** The most characters of one engine line that are logged; the rest of a longer line is dropped. */
export const MAX_LINE_CHARS = 16_384

/** One line of output; `cut`: it had more than the splitter's bound, and `text` is its head. */
export interface OutputLine {
  readonly text: string
  readonly cut: boolean
}

/** Splits text pushed in pieces into lines of at most `maxChars` characters. */
export class LineSplitter {
  readonly #maxChars: number
  #line = ""
  /** The current line was cut and emitted: its rest is dropped up to its end. */
  #dropping = false
  /** The last piece ended with "\r": a "\n" at the start of the next one belongs to it. */
  #afterCr = false

  constructor(maxChars: number) {
    this.#maxChars = maxChars
  }

  /** The lines that `text` completes (or cuts), in order. One scan of it (a RegExp's lastIndex moves on). */
  push(text: string): Array<OutputLine> {
    const out: Array<OutputLine> = []
    const ends = /\r\n|\r|\n/g
    ends.lastIndex = this.#afterCr && text.startsWith("\n") ? 1 : 0
    this.#afterCr = false
    for (let i = ends.lastIndex; i < text.length; i = ends.lastIndex) {
      const end = ends.exec(text)
      this.#take(text.slice(i, end === null ? text.length : end.index), out)
      if (end === null) break
      if (this.#dropping) this.#dropping = false
      else out.push({ text: this.#line, cut: false })
      this.#line = ""
      // a "\r" that ends the piece: a "\n" starting the next one is part of this line's end
      if (end[0] === "\r" && ends.lastIndex === text.length) this.#afterCr = true
    }
    return out
  }

  /** The output ended: its last line, if it had no end of its own. */
  end(): Array<OutputLine> {
    const last = this.#line.length > 0 && !this.#dropping ? [{ text: this.#line, cut: false }] : []
    this.#line = ""
    this.#dropping = false
    return last
  }

  #take(piece: string, out: Array<OutputLine>): void {
    if (this.#dropping || piece.length === 0) return
    const room = this.#maxChars - this.#line.length
    if (piece.length <= room) {
      this.#line += piece
      return
    }
    out.push({ text: this.#line + piece.slice(0, room), cut: true })
    this.#line = ""
    this.#dropping = true
  }
}

/** Engine lines logged at once, then per second: an engine may print its start-up's hundreds at once. */
export const LOGGED_LINES_BURST = 10_000
export const LOGGED_LINES_PER_SEC = 1_000

/**
 * Which engine lines are logged: LOGGED_LINES_BURST at once, then LOGGED_LINES_PER_SEC (a token bucket); the others
 * are kept for /status but not logged, and counted. An engine that redrew a progress bar 500,000 times at once (lines
 * ended by "\r") took 3 s of the agent's CPU, most of it logging lines a collector could not take anyway (the log's
 * backlog bound dropped two thirds of them). `take` says whether a line is logged and, when due, how many were not
 * (at most once a second: a second or more after the first one not logged since the last count; `due` says so
 * between lines); `flush` what is left at the output's end. Pure: the caller passes the time (ms).
 */
export class OutputBudget {
  #left = LOGGED_LINES_BURST
  #at: number | undefined
  #dropped = 0
  /** When the first line not logged since the last count came. */
  #droppedSince = 0

  take(nowMs: number): { readonly log: boolean; readonly dropped?: number } {
    const since = this.#at === undefined ? 0 : Math.max(0, nowMs - this.#at)
    this.#left = Math.min(LOGGED_LINES_BURST, this.#left + (since / 1000) * LOGGED_LINES_PER_SEC)
    this.#at = nowMs
    const log = this.#left >= 1
    if (log) this.#left -= 1
    else {
      if (this.#dropped === 0) this.#droppedSince = nowMs
      this.#dropped += 1
    }
    const dropped = this.due(nowMs)
    return dropped === undefined ? { log } : { log, dropped }
  }

  /**
   * The count of lines not logged, when one is due at `nowMs` (a second or more after the first of them; then none
   * are pending): also asked on a timer, since an engine that goes quiet after a flood takes no more lines.
   */
  due(nowMs: number): number | undefined {
    // the wall clock stepped back: a second from now (a step back of an hour kept the count back an hour)
    if (nowMs < this.#droppedSince) this.#droppedSince = nowMs
    return this.#dropped === 0 || nowMs - this.#droppedSince < 1000 ? undefined : this.flush()
  }

  /** The lines not logged and not yet reported (then none are). */
  flush(): number {
    const dropped = this.#dropped
    this.#dropped = 0
    return dropped
  }
}
