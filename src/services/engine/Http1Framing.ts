/**
 * HTTP/1.1 framing for the engine client (layers/engine/http1.ts), without I/O: the request head we write, and
 * what a response head says — its status, how its body is framed (RFC 9112 section 6.3: chunked, a length, or
 * until the connection closes) and whether the connection can carry another request.
 */

export type Framing =
  | { readonly kind: "length"; readonly length: number }
  | { readonly kind: "chunked" }
  | { readonly kind: "close" }

export interface ResponseHead {
  readonly status: number
  readonly framing: Framing
  readonly keepAlive: boolean
}

export interface RequestHead {
  readonly method: string
  readonly path: string
  /** host[:port], the Host header. */
  readonly host: string
  readonly headers: Readonly<Record<string, string>>
  readonly body: string | null
}

/** A value that could end the head early (a caller's x-request-id with a line break) is refused. */
const UNSAFE_VALUE = /[\r\n\0]/
const UNSAFE_NAME = /[\r\n\0:\s]/

/** The request as written to the socket, or the reason it cannot be. */
export const requestHead = (r: RequestHead): { readonly text: string } | { readonly invalid: string } => {
  let text = `${r.method} ${r.path} HTTP/1.1\r\nhost: ${r.host}\r\n`
  for (const name in r.headers) {
    const value = r.headers[name] as string
    if (UNSAFE_NAME.test(name) || UNSAFE_VALUE.test(value))
      return { invalid: `header ${JSON.stringify(name)} has a line break, NUL or (in its name) a colon or space` }
    text += `${name}: ${value}\r\n`
  }
  text += r.body === null ? "\r\n" : `content-length: ${Buffer.byteLength(r.body)}\r\n\r\n${r.body}`
  return { text }
}

/**
 * A response head (the text before the blank line), or why it is not one. An interim 1xx head has status
 * 100-199; the caller skips it and reads the next head.
 */
export const parseResponseHead = (head: string): ResponseHead | { readonly invalid: string } => {
  const lines = head.split("\r\n")
  const m = /^HTTP\/1\.([01]) (\d{3})(?: |$)/.exec(lines[0] ?? "")
  if (m === null) return { invalid: `not an HTTP/1.x status line: ${JSON.stringify((lines[0] ?? "").slice(0, 80))}` }
  const status = Number(m[2])
  let length: number | undefined
  let chunked = false
  let keepAlive = m[1] === "1" // HTTP/1.1 keeps the connection unless told; 1.0 closes unless told
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i] as string
    const colon = line.indexOf(":")
    if (colon <= 0) continue
    const name = line.slice(0, colon).trim().toLowerCase()
    const value = line
      .slice(colon + 1)
      .trim()
      .toLowerCase()
    if (name === "content-length") {
      const n = /^\d+$/.test(value) ? Number(value) : Number.NaN
      if (!Number.isSafeInteger(n) || (length !== undefined && length !== n))
        return { invalid: `bad content-length: ${JSON.stringify(value)}` }
      length = n
    } else if (name === "transfer-encoding") chunked = value.split(",").at(-1)?.trim() === "chunked"
    else if (name === "connection") {
      const tokens = value.split(",").map((t) => t.trim())
      if (tokens.includes("close")) keepAlive = false
      else if (tokens.includes("keep-alive")) keepAlive = true
    }
  }
  const framing: Framing =
    status === 204 || status === 304 || (status >= 100 && status < 200)
      ? { kind: "length", length: 0 }
      : chunked
        ? { kind: "chunked" }
        : length !== undefined
          ? { kind: "length", length }
          : { kind: "close" }
  return { status, framing, keepAlive: keepAlive && framing.kind !== "close" }
}

/** The size in a chunk-size line ("1a", "1a;ext=x"), or undefined when it is not one. */
export const parseChunkSize = (line: string): number | undefined => {
  const hex = (line.split(";")[0] as string).trim()
  if (!/^[0-9a-fA-F]{1,12}$/.test(hex)) return undefined
  return Number.parseInt(hex, 16)
}
