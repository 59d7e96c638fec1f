// Fault switches that can change at run time (POST /sim/faults), and the pure merge of such a request.
import type { ErrorKind, SimConfig } from "./simConfig.ts"

export interface Faults {
  stallAfterTokens: number | undefined
  errorRate: number
  errorKind: ErrorKind
  hangHealth: boolean
  /**
   * vLLM's engine core dead under its API server (engineDeath.ts): /health answers 503 (EngineDeadError;
   * vllm/entrypoints/serve/instrumentator/health.py) while /v1/models still lists the model; completions a bare 500,
   * streams in flight an error event; the server exits 0 within the watchdog's 5 s unless
   * VLLM_KEEP_ALIVE_ON_ENGINE_DEATH (vllm/entrypoints/launcher.py). The other flavors ignore it.
   */
  engineDead: boolean
  /** The engine core hangs while its API server answers (wedge.ts). */
  wedged: boolean
  /** One data-parallel rank's core hangs alone (wedge.ts), or undefined. */
  wedgedRank: number | undefined
}

export const initialFaults = (cfg: SimConfig): Faults => ({
  stallAfterTokens: cfg.stallAfterTokens,
  errorRate: cfg.errorRate,
  errorKind: cfg.errorKind,
  hangHealth: cfg.hangHealth,
  engineDead: false,
  wedged: false,
  wedgedRank: undefined
})

const KINDS = new Set(["http400", "http404", "http429", "http500", "midstream", "sse_error_field", "reset"])

/** Applies a /sim/faults body; returns an error text for a malformed field, and whether to crash now. */
export const applyFaults = (faults: Faults, body: unknown): { error?: string; crashNow: boolean } => {
  if (typeof body !== "object" || body === null) return { error: "body must be a JSON object", crashNow: false }
  const b = body as Record<string, unknown>
  if ("stallAfterTokens" in b) {
    const v = b.stallAfterTokens
    if (v !== null && typeof v !== "number") return { error: "stallAfterTokens: number|null", crashNow: false }
    faults.stallAfterTokens = v === null ? undefined : v
  }
  if ("errorRate" in b) {
    if (typeof b.errorRate !== "number") return { error: "errorRate: number", crashNow: false }
    faults.errorRate = b.errorRate
  }
  if ("errorKind" in b) {
    if (typeof b.errorKind !== "string" || !KINDS.has(b.errorKind))
      return { error: "errorKind: unknown", crashNow: false }
    faults.errorKind = b.errorKind as ErrorKind
  }
  if ("hangHealth" in b) faults.hangHealth = b.hangHealth === true
  if ("engineDead" in b) faults.engineDead = b.engineDead === true
  if ("wedged" in b) faults.wedged = b.wedged === true
  if ("wedged_rank" in b) {
    const v = b.wedged_rank
    if (v !== null && !(typeof v === "number" && Number.isInteger(v) && v >= 0))
      return { error: "wedged_rank: a rank number or null", crashNow: false }
    faults.wedgedRank = v === null ? undefined : v
  }
  return { crashNow: b.crashNow === true }
}
