// A POST route's JSON body as each engine reads it. llama-server's is read by cpp-httplib, then parsed by nlohmann,
// which differ from node's reading and JSON.parse in two places the simulator models: a multipart/form-data content
// type without a usable boundary, and a lone UTF-16 surrogate escape (JSON.parse takes "\ud800", nlohmann does not).
import type * as http from "node:http"
import { invalidJson } from "./errors.ts"
import { readBody } from "./http.ts"
import type { Flavor } from "./simConfig.ts"
import { unparsedBody } from "./upstreamRefusals.ts"

/** The body parsed, an error to answer (the flavor's words), or cpp-httplib's bare 400 (no body at all). */
export type JsonBody =
  | { readonly body: unknown; readonly raw: string }
  | { readonly status: number; readonly message: string; readonly reply?: unknown }
  | { readonly bare: 400 }

/**
 * cpp-httplib reads a matched route's body as multipart when its media type is exactly `multipart/form-data`, and
 * refuses one whose `boundary` parameter is missing, empty or over 70 characters (vendor/cpp-httplib/httplib.cpp,
 * Server::read_content_core, parse_multipart_boundary, extract_media_type: parameters split at `;`, trimmed, the first
 * of a name kept, surrounding quotes dropped).
 */
const noBoundary = (contentType: string | undefined): boolean => {
  const [type = "", ...params] = (contentType ?? "").split(";")
  if (type.trim() !== "multipart/form-data") return false
  const value = params
    .map((p) => [p.slice(0, p.indexOf("=")).trim(), p.slice(p.indexOf("=") + 1).trim()])
    .find(([k]) => k === "boundary")?.[1]
  const boundary = value !== undefined && /^".*"$/.test(value) ? value.slice(1, -1) : value
  return boundary === undefined || boundary === "" || boundary.length > 70
}

const LOW = "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"
const HIGH = "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"

/**
 * nlohmann's parse error for the first lone surrogate escape in `raw` (already valid JSON to JSON.parse), or
 * undefined. Its lexer (nlohmann/json lexer::scan_string) reads a high surrogate's `\uXXXX`, then wants `\u` and a low
 * one, and fails at the first character that is not; a low one alone fails at once. The parser words it with the line
 * and column (in bytes) of the last character read, what it was parsing (a value, or an object key) and the string's
 * text so far (parser::exception_message).
 */
export const surrogateError = (raw: string): string | undefined => {
  const open: Array<string> = []
  let key = false
  let line = 1
  let lineStart = 0
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i]
    if (c === "\n") [line, lineStart] = [line + 1, i + 1]
    if (c === "{" || c === "[") open.push(c)
    if (c === "}" || c === "]") open.pop()
    if (c !== '"') {
      if (c === "{" || c === "," || c === "[" || c === ":" || c === "}" || c === "]")
        key = (c === "{" || c === ",") && open.at(-1) === "{"
      continue
    }
    const start = i
    let failed: { at: number; why: string } | undefined
    for (i++; raw[i] !== '"' && failed === undefined; i++) {
      if (raw[i] !== "\\" || raw[++i] !== "u") continue
      const cp = Number.parseInt(raw.slice(i + 1, i + 5), 16)
      i += 4
      if (cp >= 0xdc00 && cp <= 0xdfff) failed = { at: i, why: LOW }
      if (cp < 0xd800 || cp > 0xdbff) continue
      if (raw[i + 1] !== "\\") failed = { at: i + 1, why: HIGH }
      else if (raw[i + 2] !== "u") failed = { at: i + 2, why: HIGH }
      else {
        const low = Number.parseInt(raw.slice(i + 3, i + 7), 16)
        if (low < 0xdc00 || low > 0xdfff) failed = { at: i + 6, why: HIGH }
        i += 6
      }
    }
    if (failed !== undefined) {
      const column = Buffer.byteLength(raw.slice(lineStart, failed.at + 1))
      const what = key ? "object key" : "value"
      const token = raw.slice(start, failed.at + 1)
      return `[json.exception.parse_error.101] parse error at line ${line}, column ${column}: syntax error while parsing ${what} - invalid string: ${failed.why}; last read: '${token}'${key ? "; expected string literal" : ""}`
    }
    key = false
  }
  return undefined
}

/** Reads and parses a POST route's body as the flavor's engine does. */
export const readJson = async (flavor: Flavor, req: http.IncomingMessage): Promise<JsonBody> => {
  const llama = flavor === "llama_cpp"
  if (llama && noBoundary(req.headers["content-type"])) {
    req.resume()
    return { bare: 400 }
  }
  let raw = ""
  try {
    raw = await readBody(req)
    const body: unknown = JSON.parse(raw)
    const lone = llama ? surrogateError(raw) : undefined
    return lone === undefined ? { body, raw } : { status: 500, message: lone }
  } catch (err) {
    // vLLM and SGLang: FastAPI's own refusal, in each engine's validation-error words (upstreamRefusals.ts)
    const upstream = unparsedBody(flavor, raw)
    if (upstream !== undefined) return { status: upstream.status, message: upstream.message, reply: upstream.body }
    return invalidJson(flavor, err instanceof Error ? err.message : String(err), raw)
  }
}

/** cpp-httplib's answer to a body it could not read: the status alone, and the connection closed. */
export const bareStatus = (res: http.ServerResponse, status: number): void => {
  res.removeHeader("Keep-Alive")
  res.shouldKeepAlive = false
  // the answer's own `connection: close`, as llamaFraming drops node's on a kept connection
  res.writeHead(status, { connection: "close", "content-length": 0 })
  res.end()
}
