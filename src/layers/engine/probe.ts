/**
 * The engine's readiness/liveness probe, one attempt at a time: GET the url (200 = ready) or, for a completion
 * probe, POST the body (200 = ready). Never fails: connection refused, 503, timeouts and any other error are
 * "not yet" with a short reason and a startup phase to show. Each attempt has its own timeout.
 */
import { Effect } from "effect"
import type { ReadinessProbe } from "../../services/engine/Engine.ts"

export type ProbeResult =
  | { readonly ok: true }
  | { readonly ok: false; readonly reason: string; readonly phase: "waiting for port" | "loading" | "probe timeout" }

const causeCode = (err: unknown): string | undefined => {
  const cause = (err as { cause?: { code?: unknown } } | undefined)?.cause
  return typeof cause?.code === "string" ? cause.code : undefined
}

export const probeOnce = (probe: ReadinessProbe, timeoutMs: number): Effect.Effect<ProbeResult> =>
  Effect.promise(async (signal): Promise<ProbeResult> => {
    const timeout = AbortSignal.timeout(Math.max(1, timeoutMs))
    const init: RequestInit =
      probe.kind === "http"
        ? { method: "GET", signal: AbortSignal.any([signal, timeout]) }
        : {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify(probe.body),
            signal: AbortSignal.any([signal, timeout])
          }
    try {
      const res = await fetch(probe.url, init)
      // Drain the body so the keep-alive connection is reusable (and a hanging body is bounded by the signal).
      await res.arrayBuffer().catch(() => undefined)
      return res.status === 200 ? { ok: true } : { ok: false, reason: `HTTP ${res.status}`, phase: "loading" }
    } catch (err) {
      if (timeout.aborted) return { ok: false, reason: `no answer within ${timeoutMs} ms`, phase: "probe timeout" }
      const code = causeCode(err)
      if (code === "ECONNREFUSED") return { ok: false, reason: "connection refused", phase: "waiting for port" }
      return {
        ok: false,
        reason: code ?? (err instanceof Error ? err.message : String(err)),
        phase: "waiting for port"
      }
    }
  })
