/**
 * What the agent's test completion (stallProbe.ts) asks each engine kind in each role: its requests (one per
 * data-parallel rank where a field or header picks the rank, each with the fields a P/D node needs to serve it with no
 * peer) and its body. Pure data from the engine backends (Engine.capabilities), no I/O.
 */
import type { EngineKind, ProxiedKind, Role } from "../../services/config/Config.ts"
import type { CompletionPath } from "../../services/engine/EngineClient.ts"
import { engineFor } from "./backends/index.ts"

/** Tokens the probe asks for: more than an early-stalling engine sends, few enough to cost the engine nothing. */
export const PROBE_TOKENS = 16

/** One request of the probe: the fields it adds, and the data-parallel rank it runs on (undefined: any). */
export interface ProbeRequest {
  readonly fields: Readonly<Record<string, string | number>>
  readonly rank?: number | undefined
}

/** What the probe's requests add to the OpenAI fields for one engine kind in one role. */
export interface ProbeShape {
  /** The engine takes `ignore_eos` (Engine.capabilities.ignoreEos). */
  readonly ignoreEos: boolean
  /**
   * The requests the probe sends, each with the fields that let the engine serve it with no P/D peer
   * (Engine.capabilities.peerlessFields): with dp > 1, one per rank where a field (rankField, or peerlessRankField
   * on a P/D node) or a header (rankHeader) picks the rank, else one.
   */
  readonly requests: ReadonlyArray<ProbeRequest>
}

export const probeShape = (kind: EngineKind, role: Role, dp = 1, proxiedKind?: ProxiedKind): ProbeShape => {
  const caps = engineFor(kind, proxiedKind).capabilities
  const fields = caps.peerlessFields?.[role] ?? {}
  // every field that picks the rank, set to it: on an SGLang P/D node both the room (the prefill server's
  // follow_bootstrap_room) and routed_dp_rank (which servers that take it follow first, in every role)
  const rankFields = [
    ...(caps.peerlessFields?.[role] === undefined || caps.peerlessRankField === undefined
      ? []
      : [caps.peerlessRankField]),
    ...(caps.rankField === undefined ? [] : [caps.rankField])
  ]
  const pinned = rankFields.length > 0 || caps.rankHeader !== undefined
  const requests: ReadonlyArray<ProbeRequest> =
    dp <= 1 || !pinned
      ? [{ fields }]
      : Array.from({ length: dp }, (_, i) => ({
          fields: { ...fields, ...Object.fromEntries(rankFields.map((f) => [f, i])) },
          rank: i
        }))
  return { ignoreEos: caps.ignoreEos === true, requests }
}

/**
 * The probe's request on `path`; the client adds the model (and `stream: false`). With `ignore_eos` the engine
 * generates all PROBE_TOKENS, so a model's early end cannot pass for a working engine; elsewhere the request carries
 * only OpenAI fields, and the shape's P/D fields.
 */
export const probeBody = (
  path: CompletionPath,
  shape: ProbeShape,
  fields: Readonly<Record<string, string | number>> = shape.requests[0]?.fields ?? {}
) => ({
  ...(path === "/v1/completions" ? { prompt: "ping" } : { messages: [{ role: "user", content: "ping" }] }),
  max_tokens: PROBE_TOKENS,
  temperature: 0,
  ...(shape.ignoreEos ? { ignore_eos: true } : {}),
  ...fields
})
