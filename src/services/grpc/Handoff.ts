/**
 * Handoff: the pure part of disaggregated prefill/decode. Turns an OpenAI request body into the body of a
 * prefill or decode leg for the engine backend's handoff protocol (`Engine.capabilities.handoff`:
 * "kv_transfer_params" after vLLM's toy proxy's rules; "bootstrap", SGLang's rendezvous fields), takes the
 * handoff parameters from a vLLM prefill response and checks them where the connector would silently fall
 * back to local prefill. No I/O; the gRPC layer sends the bodies. Upstream: vLLM's toy proxy
 * (examples/online_serving/disaggregated_serving/disagg_proxy_demo.py) and NixlConnector
 * (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py), whose parameters NixlParams.ts checks; SGLang's
 * bootstrap fields, which SglangBootstrap.ts checks and writes.
 */
import { Result, Schema } from "effect"
import type { Role } from "../config/ConfigSchema.ts"
import type { HandoffProtocol } from "../engine/Engine.ts"
import { isJsonObject, type JsonObject } from "../engine/EngineClient.ts"
import { INPUT_DIGEST_FIELD, ownInputDigest } from "./InputDigest.ts"
import { nixlParamsProblems } from "./NixlParams.ts"
import { type Bootstrap, type BootstrapInput, bootstrapLegBody, checkBootstrap } from "./SglangBootstrap.ts"

/**
 * The handoff cannot happen as asked; `missing` names the absent fields. Its gRPC status (FAILED_PRECONDITION)
 * is a row of GrpcStatus.ts's table.
 */
export class InvalidHandoff extends Schema.TaggedError<InvalidHandoff>()("InvalidHandoff", {
  reason: Schema.String,
  missing: Schema.Array(Schema.String)
}) {
  override get message(): string {
    return this.missing.length === 0 ? this.reason : `${this.reason}: missing or empty ${this.missing.join(", ")}`
  }
}

// ---------------------------------------------------------------------------------------------------------
// vLLM / NIXL

/** What the prefill leg asks of P: decode elsewhere, so hold the blocks and return where they are. */
export const VLLM_PREFILL_KV_TRANSFER_PARAMS: JsonObject = Object.freeze({
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null
})

/**
 * The prefill leg's body: one token and the params that ask P to hold the blocks. P hands off only a request
 * that ends LENGTH_CAPPED (NixlConnector `request_finished`, vllm/distributed/kv_transfer/kv_connector/v1/
 * nixl_connector.py); one ended by a stop string or by the end-of-sequence token returns no params, and the
 * call would fail. So the one token may end it no other way: the caller's stop sequences are left out and
 * `ignore_eos` set (vLLM's sampling extension). The token itself is dropped; D makes the text. The leg is sent
 * whole, not streamed: the parameters come only in a whole response.
 */
export const vllmPrefillBody = (body: JsonObject): JsonObject => {
  const { stop: _stop, ...rest } = body
  return { ...rest, kv_transfer_params: { ...VLLM_PREFILL_KV_TRANSFER_PARAMS }, max_tokens: 1, ignore_eos: true }
}

/** Checks handoff parameters as D's connector will (NixlParams.ts); the dict is otherwise passed on unchanged. */
export const validateKvTransferParams = (params: unknown): Result.Result<JsonObject, InvalidHandoff> => {
  if (!isJsonObject(params)) {
    return Result.fail(
      new InvalidHandoff({ reason: "kv_transfer_params must be the object the prefill leg returned", missing: [] })
    )
  }
  const { missing, wrong } = nixlParamsProblems(params)
  if (missing.length > 0 || wrong.length > 0)
    return Result.fail(new InvalidHandoff({ reason: ["invalid kv_transfer_params", ...wrong].join("; "), missing }))
  return Result.succeed(params)
}

/** The handoff parameters in P's response (top level of a completion or chat completion), checked. */
export const extractKvTransferParams = (response: JsonObject): Result.Result<JsonObject, InvalidHandoff> => {
  const params = response.kv_transfer_params
  if (!isJsonObject(params)) {
    return Result.fail(
      new InvalidHandoff({
        reason:
          "the prefill engine returned no kv_transfer_params (is it started with a KV connector such as NixlConnector?)",
        missing: ["kv_transfer_params"]
      })
    )
  }
  return validateKvTransferParams(params)
}

/** The decode leg's body: the client's body with the parameters inserted verbatim. */
export const kvTransferDecodeBody = (body: JsonObject, params: unknown): Result.Result<JsonObject, InvalidHandoff> =>
  Result.map(validateKvTransferParams(params), (valid) => ({ ...body, kv_transfer_params: valid }))

// ---------------------------------------------------------------------------------------------------------
// SGLang

/** The rendezvous checked as SGLang's decode engine will dial it (SglangBootstrap.ts). */
export const validateBootstrap = (input: BootstrapInput | undefined): Result.Result<Bootstrap, InvalidHandoff> => {
  if (input === undefined) {
    return Result.fail(
      new InvalidHandoff({ reason: "an SGLang leg needs the bootstrap rendezvous", missing: ["bootstrap"] })
    )
  }
  const checked = checkBootstrap(input)
  if (checked._tag === "Bootstrap") return Result.succeed(checked.bootstrap)
  const { problems, missing } = checked
  return Result.fail(
    new InvalidHandoff({ reason: problems.length > 0 ? problems.join("; ") : "invalid bootstrap", missing })
  )
}

// ---------------------------------------------------------------------------------------------------------
// Planning a leg from the node's role and the engine's handoff protocol

/**
 * What the gRPC layer does with one Generate call: which leg it is (`_tag`: the one place a prefill leg is told from
 * the others) and, for a P/D leg, the engine's handoff protocol. Every body is the client's body plus the handoff
 * fields; this module owns those (`kv_transfer_params`, `bootstrap_*`, the prefill leg's `max_tokens`).
 */
export type LegPlan =
  /** Role "both": the client's body as is; stream the answer. */
  | { readonly _tag: "Normal"; readonly body: JsonObject }
  /**
   * Send whole (not streamed). Over kv_transfer_params answer with `extractKvTransferParams(response)` in the final
   * message, with `inputDigest` added (InputDigest.ts withInputDigest) when there is one; over bootstrap just finish
   * (the answer comes from D).
   */
  | {
      readonly _tag: "Prefill"
      readonly protocol: HandoffProtocol
      readonly body: JsonObject
      readonly inputDigest?: string | undefined
    }
  /** Stream D's answer. */
  | { readonly _tag: "Decode"; readonly protocol: HandoffProtocol; readonly body: JsonObject }

export interface PlanInput {
  readonly role: Role
  /** The engine backend's capability (`Engine.capabilities.handoff`); undefined: the engine has no P/D. */
  readonly handoff: HandoffProtocol | undefined
  readonly body: JsonObject
  /** GenerateRequest.kv_transfer_params (decode over "kv_transfer_params"). */
  readonly kvTransferParams?: unknown
  /** GenerateRequest.bootstrap (both legs over "bootstrap"). */
  readonly bootstrap?: BootstrapInput | undefined
  /**
   * This leg's input digest (InputDigest.ts inputDigest), computed only for a vLLM P/D leg: a prefill leg adds it
   * to the params it returns, a decode leg checks the params' against it. Absent: neither (embedders, tests); a
   * decode leg's engine still gets the params without the field.
   */
  readonly inputDigest?: (() => string) | undefined
}

const differs = (): InvalidHandoff =>
  new InvalidHandoff({
    reason: `the decode leg's input differs from its prefill leg's (kv_transfer_params.${INPUT_DIGEST_FIELD}): send a decode leg the same chat or prompt, for the same model name, as the prefill leg that returned its kv_transfer_params`,
    missing: []
  })

const malformed = (value: unknown): InvalidHandoff =>
  new InvalidHandoff({
    reason: `kv_transfer_params.${INPUT_DIGEST_FIELD} must be the string the prefill leg's agent wrote, got ${JSON.stringify(value)?.slice(0, 64)}`,
    missing: []
  })

const given = (v: unknown): boolean => v !== undefined && v !== null

/** Params a prefill leg returned, to be read by a decode leg (vLLM's NixlConnector: `do_remote_prefill: true`). */
const decodeParams = (v: unknown): boolean =>
  typeof v === "object" && v !== null && (v as { do_remote_prefill?: unknown }).do_remote_prefill === true

const kvTransferLeg = (input: PlanInput, role: "prefill" | "decode"): Result.Result<LegPlan, InvalidHandoff> => {
  // A prefill leg's params, if a router sends any (vLLM's proxy sends do_remote_decode: the agent writes its own), are
  // replaced; a decode leg's sent here is a leg for the wrong node, which would run as a new prefill (its KV blocks held
  // for a decode that never comes) and answer OK with no text
  if (role === "prefill" && decodeParams(input.kvTransferParams))
    return Result.fail(
      new InvalidHandoff({
        reason:
          "kv_transfer_params on a prefill node: they are a decode leg's (the prefill leg's final gives them); send this leg to a decode node",
        missing: []
      })
    )
  if (role === "prefill")
    return Result.succeed({
      _tag: "Prefill",
      protocol: "kv_transfer_params",
      body: vllmPrefillBody(input.body),
      inputDigest: input.inputDigest?.()
    })
  if (input.kvTransferParams === undefined || input.kvTransferParams === null) {
    return Result.fail(
      new InvalidHandoff({
        reason: "a decode node needs the kv_transfer_params of the prefill leg's final message",
        missing: ["kv_transfer_params"]
      })
    )
  }
  // Checked before the params themselves: the engine gets them without the agent's field either way.
  const own = ownInputDigest(input.kvTransferParams, input.inputDigest)
  if (own._tag === "Differs") return Result.fail(differs())
  if (own._tag === "Malformed") return Result.fail(malformed(own.value))
  return Result.map(kvTransferDecodeBody(input.body, own.params), (body) => ({
    _tag: "Decode",
    protocol: "kv_transfer_params",
    body
  }))
}

const bootstrapLeg = (input: PlanInput, leg: "prefill" | "decode"): Result.Result<LegPlan, InvalidHandoff> =>
  Result.map(validateBootstrap(input.bootstrap), (b) => ({
    _tag: leg === "prefill" ? "Prefill" : "Decode",
    protocol: "bootstrap",
    body: bootstrapLegBody(input.body, b)
  }))

/**
 * The prefill node a decode leg's engine reads its KV from, `host:port` (vLLM's NIXL side channel, SGLang's bootstrap
 * server), from the leg's engine body; undefined where the body names none. Decode legs failing from two peers with
 * no call completing between them are the decode engine's failures, not their handoffs' (layers/engine/engineWatch.ts).
 */
export const handoffPeer = (body: JsonObject): string | undefined => {
  const kv = body.kv_transfer_params as Record<string, unknown> | null | undefined
  const [host, port] =
    typeof kv === "object" && kv !== null
      ? [kv.remote_host, kv.remote_port]
      : [body.bootstrap_host, body.bootstrap_port]
  return host === undefined || port === undefined ? undefined : `${String(host)}:${String(port)}`
}

const legOf: Readonly<
  Record<HandoffProtocol, (input: PlanInput, role: "prefill" | "decode") => Result.Result<LegPlan, InvalidHandoff>>
> = {
  kv_transfer_params: kvTransferLeg,
  bootstrap: bootstrapLeg
}

export const planLeg = (input: PlanInput): Result.Result<LegPlan, InvalidHandoff> => {
  const role = input.role
  if (role === "both") return Result.succeed({ _tag: "Normal", body: input.body })
  if (input.handoff === undefined) {
    // Config validation refuses this already (the backend lists no such role); kept for embedders.
    return Result.fail(
      new InvalidHandoff({
        reason: `agent.role "${role}" needs an engine with a prefill/decode handoff; this engine has none`,
        missing: []
      })
    )
  }
  // The other protocol's fields: a leg for another engine's pair, which this engine would run without its handoff
  const foreign = input.handoff === "kv_transfer_params" ? input.bootstrap !== undefined : given(input.kvTransferParams)
  if (foreign)
    return Result.fail(
      new InvalidHandoff({
        reason: `${input.handoff === "kv_transfer_params" ? "bootstrap" : "kv_transfer_params"} on a node whose engine hands off by ${input.handoff}: the leg is for another engine's pair`,
        missing: []
      })
    )
  return legOf[input.handoff](input, role)
}

// ---------------------------------------------------------------------------------------------------------
// A failed leg: retried alone, or only as a new pair

/**
 * Whether this node hosts its pairs' rendezvous: an SGLang prefill node, whose engine runs the bootstrap server both
 * legs of a pair meet at (NodeStatus publishes it; the router copies it into both legs).
 */
export const hostsRendezvous = (role: Role, handoff: HandoffProtocol | undefined): boolean =>
  role === "prefill" && handoff === "bootstrap"

/** What boundToPair reads: the node's role and handoff (as planLeg's input), and how far the call got. */
export interface PairBoundInput {
  readonly role: Role
  readonly handoff: HandoffProtocol | undefined
  /** planLeg's plan; undefined: the call was refused before it had one (planLeg's refusals included). */
  readonly leg: LegPlan | undefined
  /** Whether the engine may have seen the leg (past admission: Relay.admitted). */
  readonly engineAsked: boolean
}

/**
 * Whether a Generate call's failure that another node could take is retried only as a new pair (GrpcFailure.pairBound:
 * `cgn-retry-pair`): the one rule for every end of a call, refused by the server before its handler ran, refused by
 * the handler before or after its leg was planned, or failed once the engine was asked.
 * - On a node that hosts the rendezvous (hostsRendezvous), every call, whatever it was and however far it got: the
 *   decode leg waits on this node's bootstrap server, which no other node's prefill leg answers.
 * - A decode leg once the engine may have read its handoff (past admission): over kv_transfer_params one handoff
 *   serves one decode, over bootstrap its engine may have joined the room; refused before, it goes elsewhere as it is.
 * - Nothing else: a normal call, a vLLM prefill leg (a new prefill elsewhere is a new handoff).
 */
export const boundToPair = (input: PairBoundInput): boolean =>
  hostsRendezvous(input.role, input.handoff) || (input.leg?._tag === "Decode" && input.engineAsked)
