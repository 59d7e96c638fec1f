// The data-parallel rank a client names for its request, read as each engine reads it (pure). vLLM takes the
// `X-data-parallel-rank` header; SGLang takes that header too (first), else the body's `routed_dp_rank` (or the
// deprecated `data_parallel_rank`). A rank out of range is refused with the engine's 400. The request then runs on
// that rank whatever the balancer (ranks.ts Engines.pick), a P/D prefill server's room included.
import type * as http from "node:http"
import type { Flavor } from "./simConfig.ts"

/** A rank named (in range), none, or the engine's refusal (answered 400). */
export type DpPin = number | { readonly refused: string } | undefined

/** Python's int() of a header's text: optional sign, digits, surrounding blanks (underscores not modelled). */
const INTEGER = /^\s*[+-]?\d+\s*$/

/**
 * SGLang's body field: `routed_dp_rank`, else the deprecated `data_parallel_rank` (sgl-project/sglang
 * python/sglang/srt/entrypoints/openai/protocol.py `_migrate_deprecated_dp_rank`); an integer or a string of one, as
 * pydantic's int takes it. Other engines: none.
 */
export const bodyDpRank = (flavor: Flavor, b: Record<string, unknown>): number | undefined => {
  if (flavor !== "sglang") return undefined
  const v = b.routed_dp_rank ?? b.data_parallel_rank
  if (typeof v === "number" && Number.isInteger(v)) return v
  return typeof v === "string" && INTEGER.test(v) ? Number.parseInt(v, 10) : undefined
}

const headerText = (headers: http.IncomingHttpHeaders): string | undefined => {
  const v = headers["x-data-parallel-rank"]
  return typeof v === "string" ? v : undefined
}

/**
 * vLLM (vllm-project/vllm vllm/entrypoints/openai/serving_engine.py `_get_data_parallel_rank`): a header that is not
 * an integer is ignored; out of range, a ValueError of the input processor (vllm/v1/engine/processor.py), answered
 * 400.
 */
const vllmPin = (headers: http.IncomingHttpHeaders, size: number): DpPin => {
  const text = headerText(headers)
  if (text === undefined || !INTEGER.test(text)) return undefined
  const rank = Number.parseInt(text, 10)
  return rank >= 0 && rank < size ? rank : { refused: `data_parallel_rank ${rank} is out of range [0, ${size}).` }
}

/**
 * SGLang (sgl-project/sglang): the header, when present, wins over the body's routed_dp_rank and must be an integer
 * (python/sglang/srt/entrypoints/openai/serving_base.py extract_routed_dp_rank_from_header, an HTTPException 400; since
 * sgl-project/sglang#19832); the body's data_parallel_rank is taken for a missing routed_dp_rank (protocol.py
 * _migrate_deprecated_dp_rank). TokenizerManager.generate_request then ignores rank 0 on a server without DP and
 * refuses any other out of [0, dp) with a ValueError, answered 400 (python/sglang/srt/managers/tokenizer_manager.py;
 * serving_completions.py _handle_non_streaming_request).
 */
const sglangPin = (headers: http.IncomingHttpHeaders, body: number | undefined, size: number): DpPin => {
  const text = headerText(headers)
  if (text !== undefined && !INTEGER.test(text))
    return { refused: `Invalid X-Data-Parallel-Rank header: must be an integer, got '${text}'` }
  const rank = text === undefined ? body : Number.parseInt(text, 10)
  if (rank === undefined || (size <= 1 && rank === 0)) return undefined
  return rank >= 0 && rank < size ? rank : { refused: `routed_dp_rank=${rank} out of range [0, ${size})` }
}

/** The rank a request names (`body`: SGLang's routed_dp_rank as request.ts read it), of `size` ranks. */
export const dpPin = (
  flavor: Flavor,
  headers: http.IncomingHttpHeaders,
  body: number | undefined,
  size: number
): DpPin => {
  switch (flavor) {
    case "vllm":
      return vllmPin(headers, size)
    case "sglang":
      return sglangPin(headers, body, size)
    default:
      return undefined
  }
}
