/**
 * The engine's readiness/liveness probe, one attempt at a time: GET the url (200 = ready; for a model list, one that
 * lists no model still loading: services/engine/ModelList.ts) or, for a completion
 * probe, POST the body (200 = ready). Never fails: connection refused, 503, timeouts and any other error are
 * "not yet" with a short reason and a startup phase to show. Each attempt is bounded on Effect's Clock; the
 * timeout interrupts the exchange, which aborts the request.
 */
import { Effect, Option } from "effect"
import { getGlobalDispatcher } from "undici"
import type { ReadinessProbe } from "../../services/engine/Engine.ts"
import type { ProbeResult } from "../../services/engine/EngineHost.ts"
import { lineRedactor } from "../../services/engine/LineRedactor.ts"
import { MODEL_LIST_READ_BYTES, modelStillLoading } from "../../services/engine/ModelList.ts"
import { secretValues } from "../../services/engine/Secrets.ts"
import { hostShortage } from "../../services/node/HostShortage.ts"
import { type EngineRequest, keyHeader, keyRefusal, sendWhole, target } from "./engineHttp.ts"
import { errorCode } from "./exchange.ts"

export type { ProbeResult } from "../../services/engine/EngineHost.ts"

/**
 * The most of a body the probe reads only to drain it, so the keep-alive connection is reusable; a longer one closes
 * its connection. undici's own `dump()` default (nodejs/undici lib/api/readable.js), which the probe drained with.
 */
const DRAIN_BYTES = 128 * 1024

const parsed = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/**
 * No answer: a port still closed, or anything else (no such host, a TLS mismatch, a reset), which the phase names.
 * The reason goes to the start's progress line, /status and NodeHealth, so a message is scrubbed of the key the probe
 * sends (the probe's other reasons are the agent's own words: a status, keyRefusal's): a rare failure, scrubbed then.
 */
const unreachable = (err: unknown, probe: ReadinessProbe): ProbeResult => {
  const code = errorCode(err)
  if (code === "ECONNREFUSED") return { ok: false, reason: "connection refused", phase: "waiting for port" }
  const shortage = hostShortage(code)
  if (shortage !== undefined)
    return {
      ok: false,
      reason: `${code}: ${shortage}`,
      phase: "the agent's host is out of resources",
      inconclusive: true
    }
  const message = () => {
    const m = err instanceof Error ? err.message : String(err)
    return probe.authorization === undefined ? m : lineRedactor(secretValues({}, [], probe.authorization))(m)
  }
  // the code and undici's or Node's words: `UND_ERR_SOCKET: other side closed`, `getaddrinfo ENOTFOUND engine.x`
  // (a bare code said little beside the other reasons' words: a soak review)
  const m = message()
  const reason = code === undefined || m.includes(code) ? m : `${code}: ${m}`
  return { ok: false, reason, phase: `unreachable (${reason})` }
}

/** The verdict on an answer's status, and on the model list's text when it was read whole. */
const verdict = (probe: ReadinessProbe, status: number, list: string | undefined): ProbeResult => {
  // An engine that wants a key the agent does not send, or another, would otherwise read as loading for ever.
  const refusal = keyRefusal(status, probe)
  if (refusal !== undefined) return { ok: false, reason: refusal, phase: "unauthorized" }
  if (status !== 200) return { ok: false, reason: `HTTP ${status}`, phase: "loading" }
  return probe.kind === "http" &&
    probe.modelList !== undefined &&
    list !== undefined &&
    modelStillLoading(parsed(list), probe.modelList)
    ? { ok: false, reason: "the model list shows the model still loading (meta: null)", phase: "loading" }
    : { ok: true }
}

// On undici's global dispatcher, never the EngineClient's Agent: the supervisor probes before any client exists, and a
// probe must not queue behind the client's stream connections. Not the global fetch: it would load Node's own second
// copy of undici, with its own llhttp WebAssembly instance, ~8 MB of RSS for one request every few seconds.
const attempt = (probe: ReadinessProbe): Effect.Effect<ProbeResult> => {
  let request: EngineRequest
  try {
    const headers = keyHeader(probe.authorization)
    request =
      probe.kind === "http"
        ? { ...target(probe.url), method: "GET", headers, body: null }
        : {
            ...target(probe.url),
            method: "POST",
            headers: { "content-type": "application/json", ...headers },
            body: JSON.stringify(probe.body)
          }
  } catch (err) {
    return Effect.succeed(unreachable(err, probe))
  }
  // The body is read whole only for a model list's 200; any other is drained (a hanging one is bounded by the timeout).
  const readsList = (status: number) => probe.kind === "http" && probe.modelList !== undefined && status === 200
  return sendWhole(getGlobalDispatcher(), request, (status) =>
    readsList(status) ? MODEL_LIST_READ_BYTES : DRAIN_BYTES
  ).pipe(
    // A list past its bound is taken at its 200, unread.
    Effect.map((a) => verdict(probe, a.status, a.cut ? undefined : a.text)),
    // A body that breaks off after its status: the status answers, unless the list was to be read from it.
    Effect.catch((f) =>
      Effect.succeed(
        f.status > 0 && !readsList(f.status) ? verdict(probe, f.status, undefined) : unreachable(f.error, probe)
      )
    )
  )
}

export const probeOnce = (probe: ReadinessProbe, timeoutMs: number): Effect.Effect<ProbeResult> =>
  attempt(probe).pipe(
    Effect.timeoutOption(Math.max(1, timeoutMs)),
    Effect.map(
      Option.getOrElse(
        (): ProbeResult => ({ ok: false, reason: `no answer within ${timeoutMs} ms`, phase: "probe timeout" })
      )
    )
  )
