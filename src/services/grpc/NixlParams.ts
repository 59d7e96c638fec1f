/**
 * The decode leg's kv_transfer_params as vLLM's NixlConnector on the decode engine reads them (pure): the dict the
 * prefill engine returned from `request_finished` (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py:
 * do_remote_prefill true, do_remote_decode false, its block ids, engine id, host and port, tp_size). Otherwise opaque
 * and passed on as it came. What the connector falls back on silently is refused here: without `do_remote_prefill`
 * the decode engine prefills the prompt itself and the prefill engine's blocks stay held until they expire; with
 * `do_remote_decode` it holds its own blocks for a decode that never comes; a value the prefill engine never returns
 * (a port as a string, a block id that is not one) failed in the engine mid-stream, read as the engine's failure and
 * retried on another pair (a P/D fuzz). A router passing the params on verbatim sends none of these.
 */

/**
 * Fields D needs to pull; without any of them vLLM logs "Got invalid KVTransferParams" and recomputes.
 * `remote_request_id` is not among them: it exists only since vLLM PR #29665 (Nov 2025); an older
 * NixlConnector neither sends nor reads it (D notifies P under its own request id, the same X-Request-Id
 * on both legs), so requiring it would refuse every hand-off from an older prefill engine.
 */
const VLLM_REQUIRED_FIELDS = [
  "do_remote_prefill",
  "remote_block_ids",
  "remote_engine_id",
  "remote_host",
  "remote_port"
] as const

const present = (v: unknown): boolean => v !== undefined && v !== null && v !== ""

// Newer builds send one block list per KV-cache group: non-empty means at least one block in any group.
const hasBlocks = (v: unknown): boolean =>
  Array.isArray(v) && v.some((x) => (Array.isArray(x) ? x.length > 0 : present(x)))

const blockId = (x: unknown): boolean => Number.isSafeInteger(x) && (x as number) >= 0
const blockIds = (v: unknown): boolean =>
  Array.isArray(v) && v.every((x) => (Array.isArray(x) ? x.every(blockId) : blockId(x)))

const shown = (v: unknown): string => {
  const text = JSON.stringify(v) ?? String(v)
  return text.length > 40 ? `${text.slice(0, 40)}...` : text
}

/** Fields absent or empty (`missing`), and values the prefill engine never returns (`wrong`, each said why). */
export const nixlParamsProblems = (
  params: Readonly<Record<string, unknown>>
): { readonly missing: Array<string>; readonly wrong: Array<string> } => {
  const missing: Array<string> = VLLM_REQUIRED_FIELDS.filter((f) =>
    f === "remote_block_ids" ? !hasBlocks(params[f]) : !present(params[f])
  )
  // Optional, but a newer engine that sends it sends a real id: an empty one is a broken hand-off.
  if ("remote_request_id" in params && !present(params.remote_request_id)) missing.push("remote_request_id")
  const wrong: Array<string> = []
  const is = (field: string, ok: (v: unknown) => boolean, what: string) => {
    if (present(params[field]) && !ok(params[field]))
      wrong.push(`${field} must be ${what}, got ${shown(params[field])}`)
  }
  is("do_remote_prefill", (v) => v === true, "true (the decode engine would prefill the prompt itself)")
  is("remote_block_ids", blockIds, "the prefill engine's block ids (integers >= 0, or a list of them per group)")
  is("remote_engine_id", (v) => typeof v === "string", "a string")
  is("remote_host", (v) => typeof v === "string", "a string")
  is("remote_port", (v) => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 65535, "a port, 1..65535")
  is("remote_request_id", (v) => typeof v === "string", "a string")
  is("tp_size", (v) => Number.isInteger(v) && (v as number) >= 1, "an integer >= 1")
  if (params.do_remote_decode === true)
    wrong.push(
      "do_remote_decode must not be true on a decode leg (the engine would hold its blocks for another decode)"
    )
  return { missing, wrong }
}
