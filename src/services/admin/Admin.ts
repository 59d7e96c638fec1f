/**
 * Admin: the pure policy of the admin HTTP server (layers/admin/Admin.ts) and the small interfaces it
 * exposes: which listen addresses count as loopback, when a bearer token is required and accepted,
 * what /readyz answers, the forensics shape of /status, and the typed refusal to start unprotected.
 */
import { Context, type Effect, Schema } from "effect"
import type { ExitRecord } from "../engine/EngineProcess.ts"
import type { NodeHealth } from "../node/NodeStatus.ts"

/** listen_admin is not loopback and no `[agent].admin_token` is configured: refuse to start. */
export class AdminTokenRequired extends Schema.TaggedError<AdminTokenRequired>()("AdminTokenRequired", {
  listen: Schema.String
}) {
  override get message(): string {
    return (
      `agent.listen_admin = "${this.listen}" is not a loopback address, so /status and /drain would be open to ` +
      `the network: set agent.admin_token (or the CGN_AGENT_ADMIN_TOKEN variable), or listen on 127.0.0.1`
    )
  }
}

/** The admin server could not listen on listen_admin (the address is in use, or not on this host). */
export class AdminListenError extends Schema.TaggedError<AdminListenError>()("AdminListenError", {
  listen: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `agent.listen_admin = "${this.listen}": ${this.reason}`
  }
}

/** Where the admin server listens, once bound (port 0 resolved). */
export interface AdminServerInfo {
  readonly host: string
  readonly port: number
  /** `http://host:port`, IPv6 bracketed. */
  readonly url: string
}

export class AdminServer extends Context.Service<AdminServer, AdminServerInfo>()("cgn-agent/AdminServer") {}

/** Extra top-level sections of /status, each computed per request (e.g. `registration` from the etcd reporter). */
export type StatusExtras = Readonly<Record<string, Effect.Effect<unknown>>>

/** The bearer token of an Authorization header, or undefined. */
export const bearerToken = (header: string | undefined): string | undefined => {
  const m = header === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(header)
  return m?.[1]
}

/** Constant-time for equal lengths, so the token cannot be guessed byte by byte from response times. */
export const tokenMatches = (given: string, expected: string): boolean => {
  const a = new TextEncoder().encode(given)
  const b = new TextEncoder().encode(expected)
  let diff = a.length ^ b.length
  for (let i = 0; i < b.length; i++) diff |= (a[i] ?? 0) ^ (b[i] ?? 0)
  return diff === 0
}

/** The auth decision for a protected endpoint (/status, /drain). */
export type AuthDecision = "open" | "allowed" | "missing" | "wrong" | "browser"

/**
 * Whether a request was made by a web page: browsers send `Origin` with every POST and cross-origin request, and
 * `Sec-Fetch-Site` with every request ("none" when a person typed the URL). curl, the agent's CLI and Node's
 * fetch send neither.
 */
export const fromWebPage = (origin: string | undefined, secFetchSite: string | undefined): boolean =>
  origin !== undefined || (secFetchSite !== undefined && secFetchSite !== "none")

/**
 * A configured token is always required (on loopback too: whoever set one meant it). Without one, only a
 * loopback listener is open; a non-loopback one never starts (AdminTokenRequired), and is refused here too.
 * The open loopback listener refuses web pages: any page in a browser on the host could otherwise drain the
 * node with a plain cross-site POST (no CORS preflight for it). With a token a page cannot get in anyway: it
 * cannot send the Authorization header cross-site without a preflight, which is never answered.
 */
export const authorize = (options: {
  readonly loopback: boolean
  readonly token: string | undefined
  readonly header: string | undefined
  readonly webPage?: boolean
}): AuthDecision => {
  if (options.token === undefined) return !options.loopback ? "missing" : options.webPage ? "browser" : "open"
  const given = bearerToken(options.header)
  if (given === undefined) return "missing"
  return tokenMatches(given, options.token) ? "allowed" : "wrong"
}

const SHORT_ESCAPES: Readonly<Record<number, string>> = { 92: "\\\\", 10: "\\n", 13: "\\r", 9: "\\t" }

const escaped = (c: number): boolean =>
  c < 0x20 || (c >= 0x7f && c <= 0x9f) || c === 0x5c || c === 0x2028 || c === 0x2029

/**
 * A text as /readyz's text/plain body writes it, on one line: its reason may carry an engine's words (the last failed
 * call's message, in NodeHealth's engine detail), which may hold CR/LF, ESC sequences or NUL, and a terminal or a log
 * that reads the body would take them as they are. Escaped as in a JSON string: `\\`, `\n`, `\r`, `\t`, `\u00XX` for
 * every other C0 or C1 control and DEL, and `\u2028`/`\u2029` (line breaks to JavaScript); the rest as it is.
 */
export const oneLine = (text: string): string => {
  let out = ""
  let at = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (!escaped(c)) continue
    out += `${text.slice(at, i)}${SHORT_ESCAPES[c] ?? `\\u${c.toString(16).padStart(4, "0")}`}`
    at = i + 1
  }
  return at === 0 ? text : out + text.slice(at)
}

/**
 * /readyz: ready only when the node state is ready and no drain has begun; a cordon says just "cordoned". The reason
 * is one line (`oneLine`).
 */
export const readiness = (
  health: NodeHealth,
  draining: boolean
): { readonly ready: boolean; readonly reason: string } => {
  if (draining || health.state === "draining") return { ready: false, reason: "draining" }
  if (health.state === "cordoned") return { ready: false, reason: "cordoned" }
  if (health.state === "ready") return { ready: true, reason: "ready" }
  const engine = health.engine
  const phase = engine ? `engine ${engine.phase}${engine.detail ? `: ${engine.detail}` : ""}` : "no engine state"
  return { ready: false, reason: oneLine(`${health.state} (${phase})`) }
}

/** One past engine run as /status shows it. */
export const exitForensics = (exit: ExitRecord) => ({
  run: exit.run,
  pid: exit.pid ?? null,
  code: exit.code,
  signal: exit.signal,
  reason: exit.reason,
  startedAt: new Date(exit.startedAt).toISOString(),
  endedAt: new Date(exit.endedAt).toISOString(),
  runtimeMs: exit.runtimeMs,
  /** Kills by the kernel's OOM killer in the agent's memory cgroup during the run; null when unknown. */
  oomKills: exit.oomKills ?? null,
  /** The memory cgroup's limit, bytes; null when none or unknown. */
  memoryLimitBytes: exit.memoryLimitBytes ?? null,
  /** The config key that fixes a well-known start failure the engine died of; null when none is known. */
  hint: exit.hint ?? null,
  lastLines: exit.lastLines
})
