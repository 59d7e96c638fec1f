/**
 * W3C Trace Context (`traceparent`): parsing the caller's header and writing the one the agent sends to
 * the engine. Pure. Version 00 only; an all-zero trace or span id is invalid, as the spec says.
 */
import { Context } from "effect"

/** The parts of a valid `traceparent`. */
export interface TraceParent {
  readonly traceId: string
  readonly spanId: string
  readonly sampled: boolean
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** The parsed header, or undefined when it is absent or malformed (then the agent starts a new trace). */
export const parseTraceparent = (header: unknown): TraceParent | undefined => {
  if (typeof header !== "string") return undefined
  const m = TRACEPARENT.exec(header)
  if (m === null || m[1] === "ff" || /^0+$/.test(m[2]!) || /^0+$/.test(m[3]!)) return undefined
  return { traceId: m[2]!, spanId: m[3]!, sampled: (Number.parseInt(m[4]!, 16) & 1) === 1 }
}

/** The header for a span: version 00, the sampled flag as bit 0. */
export const formatTraceparent = (p: TraceParent): string => `00-${p.traceId}-${p.spanId}-${p.sampled ? "01" : "00"}`

/**
 * The caller's `tracestate`, passed on with the `traceparent` (W3C Trace Context §3.3: a participant that does not
 * add an entry passes it on as received), or undefined: none, or not a header value such a list can be (printable
 * ASCII within the spec's 512 characters a participant must pass on; a longer one may be dropped whole).
 */
export const tracestateToPass = (header: unknown): string | undefined =>
  typeof header === "string" && header.length > 0 && header.length <= 512 && /^[\x20-\x7e]*$/.test(header)
    ? header
    : undefined

/**
 * True when spans are exported (layers/observability/Tracing.ts provides it). Otherwise no span is made for a call and
 * the caller's `traceparent` goes to the engine unchanged: a span nobody receives would only re-parent
 * the engine's spans under an id that exists nowhere.
 */
export const TracesExported = Context.Reference<boolean>("cgn-agent/TracesExported", { defaultValue: () => false })
