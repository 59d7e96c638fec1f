/**
 * Sse: an incremental parser for `text/event-stream` (the WHATWG event-stream format), pure and I/O free.
 * Owns framing only: bytes or text in, complete events out, whatever the split of the byte stream
 * (partial lines, CR, LF or CRLF endings, several events per chunk, `:` comments, multi-line data).
 * What an event's data means (`[DONE]`, JSON, error objects) is left to the caller.
 * One departure from the spec: an `error:` field is kept (see SseEvent.error), not dropped as unknown.
 */

/** One dispatched event. `event`, `id` and `error` are set only when the stream named them. */
export interface SseEvent {
  readonly data: string
  readonly event?: string
  readonly id?: string
  /**
   * The value of an `error:` field line. Not an SSE field, but older llama.cpp servers reported a failed
   * stream with `error: {...}` followed by `data: [DONE]` (tools/server/server.cpp, `server_sent_event(sink,
   * "error", ...)`); dropping it, as the spec says to, would turn the failure into a short, successful answer.
   * An event with only this field is dispatched with `data` "".
   */
  readonly error?: string
}

/**
 * Thrown by `feed` when one event (an unfinished line, or the data or error lines of one event) grows past the
 * parser's limit: an engine that never ends a line must not grow the agent's memory without bound.
 */
export class SseEventTooLarge extends Error {
  readonly limit: number
  constructor(limit: number) {
    super(`SSE event over ${limit} bytes`)
    this.limit = limit
  }
}

/** An incremental parser; keep one per response body. */
export interface SseParser {
  /**
   * Feeds the next piece of the stream; returns the events it completed (often none or one). Throws
   * SseEventTooLarge when an event grows past the parser's limit.
   */
  readonly feed: (chunk: Uint8Array | string) => Array<SseEvent>
  /**
   * The stream has ended: a last line without its line break is taken as complete and an event
   * without its closing blank line is dispatched. The spec discards such an event; an engine whose
   * connection closes right after `data: [DONE]` should not be reported as truncated for it.
   */
  readonly end: () => Array<SseEvent>
}

const LF = 10

/**
 * A new parser with empty state. `maxEventChars` bounds what one event may hold while it is built (its
 * unfinished line and its data lines, in UTF-16 units, about bytes for the JSON engines send): checked once
 * per `feed` and on a multi-line event's second line, never per ordinary line.
 */
export const makeSseParser = (maxEventChars = Number.POSITIVE_INFINITY): SseParser => {
  const decoder = new TextDecoder("utf-8")
  // Text of an unfinished line carried to the next chunk.
  let pending = ""
  // The previous chunk ended on CR: an LF at the start of the next one belongs to it.
  let skipLf = false
  let started = false
  // Data lines of the event being built; `data` alone is the common case, so no array.
  let data: string | undefined
  let eventType: string | undefined
  let lastId: string | undefined
  let errorField: string | undefined

  const dispatch = (out: Array<SseEvent>): void => {
    if (data !== undefined || errorField !== undefined) {
      const ev: { data: string; event?: string; id?: string; error?: string } = { data: data ?? "" }
      if (eventType !== undefined) ev.event = eventType
      if (lastId !== undefined) ev.id = lastId
      if (errorField !== undefined) ev.error = errorField
      out.push(ev)
    }
    data = undefined
    eventType = undefined
    errorField = undefined
  }

  const line = (text: string, start: number, end: number, out: Array<SseEvent>): void => {
    if (start === end) {
      dispatch(out)
      return
    }
    const first = text.charCodeAt(start)
    if (first === 58 /* : */) return
    // Fast path for the line every engine sends: `data: ...`.
    let field: string
    let value: string
    if (first === 100 /* d */ && text.startsWith("data:", start)) {
      field = "data"
      value = text.slice(text.charCodeAt(start + 5) === 32 ? start + 6 : start + 5, end)
    } else {
      const colon = text.indexOf(":", start)
      if (colon === -1 || colon >= end) {
        field = text.slice(start, end)
        value = ""
      } else {
        field = text.slice(start, colon)
        value = text.slice(text.charCodeAt(colon + 1) === 32 ? colon + 2 : colon + 1, end)
      }
    }
    switch (field) {
      case "data":
        if (data === undefined) data = value
        else {
          data = `${data}\n${value}`
          if (data.length > maxEventChars) throw new SseEventTooLarge(maxEventChars)
        }
        return
      case "event":
        eventType = value
        return
      case "id":
        if (!value.includes("\u0000")) lastId = value
        return
      case "error":
        errorField = errorField === undefined ? value : `${errorField}\n${value}`
        if (errorField.length > maxEventChars) throw new SseEventTooLarge(maxEventChars)
        return
      default:
        // `retry` and unknown fields carry nothing the agent uses.
        return
    }
  }

  const scan = (text: string, out: Array<SseEvent>): void => {
    let pos = 0
    const len = text.length
    if (skipLf && len > 0) {
      skipLf = false
      if (text.charCodeAt(0) === LF) pos = 1
    }
    // CR is rare (no engine sends it): without one, a plain LF search suffices.
    let cr = text.indexOf("\r", pos)
    while (pos < len) {
      let eol = text.indexOf("\n", pos)
      if (cr !== -1 && (eol === -1 || cr < eol)) eol = cr
      if (eol === -1) break
      line(text, pos, eol, out)
      pos = eol + 1
      if (eol === cr) {
        if (pos === len) skipLf = true
        else if (text.charCodeAt(pos) === LF) pos++
        cr = text.indexOf("\r", pos)
      }
    }
    pending = pos < len ? text.slice(pos) : ""
  }

  const feed = (chunk: Uint8Array | string): Array<SseEvent> => {
    let text = typeof chunk === "string" ? chunk : decoder.decode(chunk, { stream: true })
    if (!started && text.length > 0) {
      started = true
      // TextDecoder already drops a byte-order mark; a string may still carry one.
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
    }
    const out: Array<SseEvent> = []
    scan(pending.length === 0 ? text : pending + text, out)
    if (pending.length > maxEventChars) throw new SseEventTooLarge(maxEventChars)
    return out
  }

  const end = (): Array<SseEvent> => {
    const out: Array<SseEvent> = []
    const rest = pending + decoder.decode()
    pending = ""
    if (rest.length > 0) line(rest, 0, rest.length, out)
    dispatch(out)
    return out
  }

  return { feed, end }
}

/** Parses a whole stream at once (tests, small bodies). */
export const parseSse = (text: string): Array<SseEvent> => {
  const p = makeSseParser()
  return [...p.feed(text), ...p.end()]
}
