/**
 * The engine's readiness/liveness probe, one attempt at a time: GET the url (200 = ready; for a model list, one that
 * lists no model still loading: services/engine/ModelList.ts) or, for a completion
 * probe, POST the body (200 = ready). Never fails: connection refused, 503, timeouts and any other error are
 * "not yet" with a short reason and a startup phase to show. Each attempt is bounded on Effect's Clock; the
 * timeout interrupts the fetch, which aborts the request.
 */
import { Effect, Option } from "effect"
import { request } from "undici"
import type { ReadinessProbe } from "../../services/engine/Engine.ts"
import type { ProbeResult } from "../../services/engine/EngineHost.ts"
import { MODEL_LIST_READ_BYTES, modelStillLoading } from "../../services/engine/ModelList.ts"

export type { ProbeResult } from "../../services/engine/EngineHost.ts"

/** undici rejects with the socket's own error (`code` ECONNREFUSED, ECONNRESET...) or one of its UND_ERR_* errors. */
const errorCode = (err: unknown): string | undefined => {
  const code = (err as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? code : undefined
}

/** The body's text, or undefined when it is longer than `limit` bytes (the body is then destroyed, its connection closed). */
const readUpTo = async (body: AsyncIterable<Buffer>, limit: number): Promise<string | undefined> => {
  const chunks: Array<Buffer> = []
  let size = 0
  for await (const chunk of body) {
    size += chunk.length
    if (size > limit) return undefined
    chunks.push(chunk)
  }
  return Buffer.concat(chunks).toString("utf8")
}

const parsed = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

// The undici package (the EngineClient's HTTP client), not the global fetch: fetch would load Node's own second
// copy of undici, with its own llhttp WebAssembly instance, ~8 MB of RSS for one request every few seconds.
const attempt = (probe: ReadinessProbe): Effect.Effect<ProbeResult> =>
  Effect.promise(async (signal): Promise<ProbeResult> => {
    try {
      const auth = probe.authorization === undefined ? {} : { authorization: probe.authorization }
      const res = await request(
        probe.url,
        probe.kind === "http"
          ? { method: "GET", headers: auth, signal }
          : {
              method: "POST",
              headers: { "content-type": "application/json", ...auth },
              body: JSON.stringify(probe.body),
              signal
            }
      )
      const model = probe.kind === "http" && res.statusCode === 200 ? probe.modelList : undefined
      const text = model !== undefined ? await readUpTo(res.body, MODEL_LIST_READ_BYTES) : undefined
      // Drain the body so the keep-alive connection is reusable (a hanging body is bounded by the timeout).
      await res.body.dump().catch(() => undefined)
      // An engine that wants a key the agent does not send, or another, would otherwise read as loading for ever.
      if (res.statusCode === 401 || res.statusCode === 403) {
        const why =
          probe.authorization !== undefined
            ? "refuses engine.api_key"
            : probe.keyWithheld === true
              ? "asks for an API key, and engine.api_key goes to engine.url's origin alone: give agent.ready_probe_url its scheme, host and port"
              : "asks for an API key: set engine.api_key"
        return { ok: false, reason: `HTTP ${res.statusCode}: the engine ${why}`, phase: "unauthorized" }
      }
      if (res.statusCode !== 200) return { ok: false, reason: `HTTP ${res.statusCode}`, phase: "loading" }
      return model !== undefined && text !== undefined && modelStillLoading(parsed(text), model)
        ? { ok: false, reason: "the model list shows the model still loading (meta: null)", phase: "loading" }
        : { ok: true }
    } catch (err) {
      const code = errorCode(err)
      if (code === "ECONNREFUSED") return { ok: false, reason: "connection refused", phase: "waiting for port" }
      // Anything else (no such host, a TLS mismatch, a reset) is not an engine still binding: the phase says why.
      const reason = code ?? (err instanceof Error ? err.message : String(err))
      return { ok: false, reason, phase: `unreachable (${reason})` }
    }
  })

export const probeOnce = (probe: ReadinessProbe, timeoutMs: number): Effect.Effect<ProbeResult> =>
  attempt(probe).pipe(
    Effect.timeoutOption(Math.max(1, timeoutMs)),
    Effect.map(
      Option.getOrElse(
        (): ProbeResult => ({ ok: false, reason: `no answer within ${timeoutMs} ms`, phase: "probe timeout" })
      )
    )
  )
