/**
 * InputDigest: ties a vLLM/NIXL decode leg to its prefill leg's input. The prefill node's agent adds
 * `cgn_input_digest` to the kv_transfer_params it returns: a digest of the served model and the leg's chat
 * messages or prompt, all that decides the KV blocks P computed. The decode node's agent compares it with the
 * digest of its own leg's input before the engine is called: a router that pairs a handoff with another input
 * would otherwise have D read blocks computed for another prompt and answer with wrong text, silently. Sampling is
 * left out (the contract says the legs "should" share it; it decides no KV block).
 *
 * The engine never sees the field: D's agent takes it out (`ownInputDigest`), so D's engine gets exactly what P's
 * engine returned. An agent that predates the field passes it on to vLLM, which reads kv_transfer_params by key and
 * ignores the rest (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py: NixlConnectorScheduler's
 * get_num_new_matched_tokens and update_state_after_alloc `.get()` the keys they use; request_finished builds P's
 * dict afresh, so P's engine never echoes a key it was sent).
 *
 * Stable across nodes and agent versions: the digested text is JSON (ECMAScript's JSON.stringify, which writes
 * every string one way) of an array of fixed-order fields, the messages in their order, nothing sorted; the value
 * names its scheme ("v1:"), and a scheme this agent does not know (a newer agent's) is accepted unchecked, so a
 * rolling upgrade never fails hand-offs. Pure: the SHA-256 comes from the caller (src/services imports no node:*).
 */
import type { GenerateRequest } from "../../gen/cgn/agent/v1/agent.ts"

/** The key the agent adds to a prefill leg's kv_transfer_params. */
export const INPUT_DIGEST_FIELD = "cgn_input_digest"

/** This version's scheme: the prefix of every digest it writes, and the only one it checks. */
const SCHEME = "v1:"
const SCHEME_PATTERN = /^v\d+:/

/** SHA-256 of the text's UTF-8 bytes, base64url (the gRPC layer passes node:crypto's). */
export type Sha256 = (text: string) => string

/**
 * The input fields of a request that planRequest accepted. `chat` wins over `prompt` when a message carries both,
 * as in planRequest. ChatMessage has role and content only: a field added to it that the engine gets must be added
 * here too (test/grpc/input-digest.test.ts fails until it is).
 */
export type LegInput = Pick<GenerateRequest, "chat" | "prompt">

/** The text digested (scheme v1): JSON of [tag, model, kind, input], chat messages as [role, content] in order. */
export const canonicalInput = (model: string, input: LegInput): string =>
  JSON.stringify(
    input.chat !== undefined
      ? ["cgn-input-v1", model, "chat", input.chat.messages.map((m) => [m.role, m.content])]
      : ["cgn-input-v1", model, "prompt", input.prompt ?? ""]
  )

/** The value of `cgn_input_digest` for a leg of `model` with this input. */
export const inputDigest = (sha256: Sha256, model: string, input: LegInput): string =>
  `${SCHEME}${sha256(canonicalInput(model, input))}`

/** P: the engine's params with the agent's digest added. */
export const withInputDigest = (params: Record<string, unknown>, digest: string): Record<string, unknown> => ({
  ...params,
  [INPUT_DIGEST_FIELD]: digest
})

/** What D's agent finds in the params it was given. */
export type OwnInput =
  /** The params without the agent's field: what the engine gets. */
  | { readonly _tag: "Same"; readonly params: unknown }
  /** The digest names another input than this leg's. */
  | { readonly _tag: "Differs" }
  /** The field is there but is no digest an agent writes. */
  | { readonly _tag: "Malformed"; readonly value: unknown }

/**
 * D: checks the params' digest against this leg's (`own`, computed only when there is one to check; absent: no
 * check) and takes the field out. Params without it (an older agent's, or a router that built them itself) are
 * accepted as they are; anything that is not an object is left to the params' own validation.
 */
export const ownInputDigest = (params: unknown, own: (() => string) | undefined): OwnInput => {
  if (typeof params !== "object" || params === null || Array.isArray(params)) return { _tag: "Same", params }
  if (!(INPUT_DIGEST_FIELD in params)) return { _tag: "Same", params }
  const { [INPUT_DIGEST_FIELD]: digest, ...rest } = params as Record<string, unknown>
  if (typeof digest !== "string" || !SCHEME_PATTERN.test(digest)) return { _tag: "Malformed", value: digest }
  if (own !== undefined && digest.startsWith(SCHEME) && digest !== own()) return { _tag: "Differs" }
  return { _tag: "Same", params: rest }
}
