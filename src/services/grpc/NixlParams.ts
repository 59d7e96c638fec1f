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

/**
 * A JSON value as Python's truth test reads it: vLLM's scheduler asks `params.get("do_remote_decode")` (NixlConnector
 * `update_state_after_alloc`), so "false", 1 or [0] mean a remote decode as `true` does, and take the branch before
 * `do_remote_prefill`'s: the decode engine then holds its blocks and never pulls the prefill's.
 */
const pythonTrue = (v: unknown): boolean => {
  if (v === undefined || v === null || v === false || v === 0 || v === "") return false
  if (Array.isArray(v)) return v.length > 0
  if (typeof v === "object") return Object.keys(v).length > 0
  return true
}

// Newer builds send one block list per KV-cache group: non-empty means at least one block in any group.
const hasBlocks = (v: unknown): boolean =>
  Array.isArray(v) && v.some((x) => (Array.isArray(x) ? x.length > 0 : present(x)))

const blockId = (x: unknown): boolean => Number.isSafeInteger(x) && (x as number) >= 0
const blockIds = (v: unknown): boolean =>
  Array.isArray(v) && v.every((x) => (Array.isArray(x) ? x.every(blockId) : blockId(x)))

/**
 * A host name (dot-separated labels of letters, digits, "-" and "_", at most 253 characters) or an IP literal, IPv6
 * unbracketed: vLLM's make_zmq_path brackets one itself (vllm/utils/network_utils.py), and the prefill engine sends
 * VLLM_NIXL_SIDE_CHANNEL_HOST as it is set. Anything else (a CR/LF, an escape sequence: a hostile router's or engine's
 * "127.0.0.1\r\nevil\e[2J") reached the decode engine, which dials it and logs it.
 */
const LABEL = "[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
const HOST_NAME = new RegExp(`^(?=.{1,253}$)${LABEL}(?:\\.${LABEL})*\\.?$`)
const IPV4 = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/
// The URL parser drops tabs and newlines before it reads a host: only an address's characters may reach it.
const isIpv6 = (v: string): boolean => /^[0-9A-Fa-f:.]+$/.test(v) && v.includes(":") && URL.canParse(`http://[${v}]/`)
/** Whether `v` is a host to dial: a name, an IPv4 literal (all-digit labels must be one), or a bare IPv6 literal. */
export const isHostOrIp = (v: unknown): boolean =>
  typeof v === "string" && (/^[\d.]+$/.test(v) ? IPV4.test(v) : HOST_NAME.test(v) || isIpv6(v))

const shown = (v: unknown): string => {
  const text = JSON.stringify(v) ?? String(v)
  return text.length > 40 ? `${text.slice(0, 40)}...` : text
}

/** Fields absent or empty (`missing`), and values the prefill engine never returns (`wrong`, each said why). */
export const nixlParamsProblems = (
  params: Readonly<Record<string, unknown>>
): { readonly missing: Array<string>; readonly wrong: Array<string> } => {
  // A block list with no block is missing; a value that is no list at all is wrong (said once, below, not both).
  const missing: Array<string> = VLLM_REQUIRED_FIELDS.filter((f) =>
    f === "remote_block_ids" && Array.isArray(params[f]) ? !hasBlocks(params[f]) : !present(params[f])
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
  is("remote_host", isHostOrIp, "a host name or IP address")
  is("remote_port", (v) => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 65535, "a port, 1..65535")
  is("remote_request_id", (v) => typeof v === "string", "a string")
  is("tp_size", (v) => Number.isInteger(v) && (v as number) >= 1, "an integer >= 1")
  if (pythonTrue(params.do_remote_decode))
    wrong.push(
      `do_remote_decode must not be true on a decode leg (the engine would hold its blocks for another decode and ` +
        `not pull the prefill's), got ${shown(params.do_remote_decode)}`
    )
  return { missing, wrong }
}
