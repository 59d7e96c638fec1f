/**
 * The engine's readiness/liveness probe, one attempt at a time: GET the url (200 = ready) or, for a completion
 * probe, POST the body (200 = ready). Never fails: connection refused, 503, timeouts and any other error are
 * "not yet" with a short reason and a startup phase to show. Each attempt is bounded on Effect's Clock; the
 * timeout interrupts the fetch, which aborts the request.
 */
import { Effect, Option } from "effect"
import type { ReadinessProbe } from "../../services/engine/Engine.ts"
import type { ProbeResult } from "../../services/engine/EngineHost.ts"

export type { ProbeResult } from "../../services/engine/EngineHost.ts"

const causeCode = (err: unknown): string | undefined => {
  const cause = (err as { cause?: { code?: unknown } } | undefined)?.cause
  return typeof cause?.code === "string" ? cause.code : undefined
}

const attempt = (probe: ReadinessProbe): Effect.Effect<ProbeResult> =>
  Effect.promise(async (signal): Promise<ProbeResult> => {
    const init: RequestInit =
      probe.kind === "http"
        ? { method: "GET", signal }
        : { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(probe.body), signal }
    try {
      const res = await fetch(probe.url, init)
      // Drain the body so the keep-alive connection is reusable (a hanging body is bounded by the timeout).
      await res.arrayBuffer().catch(() => undefined)
      return res.status === 200 ? { ok: true } : { ok: false, reason: `HTTP ${res.status}`, phase: "loading" }
    } catch (err) {
      const code = causeCode(err)
      if (code === "ECONNREFUSED") return { ok: false, reason: "connection refused", phase: "waiting for port" }
      return {
        ok: false,
        reason: code ?? (err instanceof Error ? err.message : String(err)),
        phase: "waiting for port"
      }
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
