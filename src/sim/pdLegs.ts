// The P/D legs of one simulated request, around generation. Before: an SGLang decode server waits for the
// prefill side's bootstrap room to finish, an SGLang prefill server holds the request until the decode side
// connects, a vLLM decode leg pulls the prefill engine's blocks over NIXL (or computes the prefill locally).
// After: a vLLM prefill leg holds its blocks for the decode side and returns the kv_transfer_params to send.
import { hasPdConnector, type SimContext } from "./context.ts"
import type { Admission, KvBlocks } from "./kvblocks.ts"
import { fetchBlocks, waitForRoom } from "./pd.ts"
import type { GenRequest } from "./request.ts"

/** How the hand-off before generation ended: go on, the client went away, or answer with an error. */
export type HandoffOutcome =
  | { readonly kind: "proceed" }
  | { readonly kind: "gone" }
  | { readonly kind: "error"; readonly status: number; readonly message: string }
  /** Taken up, then failed in its first step: vLLM's answer to a KV load that failed under the "fail" policy. */
  | { readonly kind: "failInStream" }

const GONE: HandoffOutcome = { kind: "gone" }

/** The P/D waits before a request may take a slot. `gone` says whether the client has left meanwhile. */
export const handoffBeforeGeneration = async (
  ctx: SimContext,
  gr: GenRequest,
  id: string,
  signal: AbortSignal,
  gone: () => boolean
): Promise<HandoffOutcome> => {
  const { cfg } = ctx
  if (cfg.flavor === "sglang" && cfg.disaggregationMode !== undefined && gr.bootstrap === undefined) {
    return {
      kind: "error",
      status: 400,
      message: `bootstrap_host, bootstrap_port and bootstrap_room are required in ${cfg.disaggregationMode} mode`
    }
  }
  // SGLang's fake bootstrap host (request.ts FAKE_BOOTSTRAP_HOST): the fake KV receiver or sender, no peer, no
  // wait; a prefill server still answers its one token (generate.ts).
  if (cfg.flavor === "sglang" && gr.bootstrap?.fake === true) return { kind: "proceed" }
  // SGLang decode: wait (bounded) for the prefill engine to finish this bootstrap room.
  if (cfg.flavor === "sglang" && cfg.disaggregationMode === "decode" && gr.bootstrap?.fake === false) {
    const b = gr.bootstrap
    const r = await waitForRoom(b.host, b.port, b.room, cfg.bootstrapTimeoutMs ?? 300_000, signal, cfg.prefillLoss)
    if (gone()) return GONE
    if (!r.ok) {
      ctx.log("kv transfer failed", { room: b.room, reason: r.reason })
      return { kind: "error", status: 500, message: `KV transfer for bootstrap_room ${b.room} failed: ${r.reason}` }
    }
  }

  // SGLang prefill: held in the bootstrap queue until the decode side has connected for the room.
  if (cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" && gr.bootstrap?.fake === false) {
    const room = gr.bootstrap.room
    const timeoutMs = cfg.bootstrapTimeoutMs ?? 300_000
    const connected = await (ctx.bootstrap?.waitForDecode(room, timeoutMs, signal) ?? Promise.resolve(false))
    if (gone()) return GONE
    if (!connected) {
      ctx.log("bootstrap timed out", { room })
      return {
        kind: "error",
        status: 500,
        message: `Request ${id} timed out after ${timeoutMs / 1000}s in KVPoll.Bootstrapping (bootstrap_room ${room}): no decode server connected`
      }
    }
  }

  // vLLM decode leg: pull the blocks the prefill engine holds.
  const kvp = gr.kvTransferParams
  const pd = cfg.flavor === "vllm" && hasPdConnector(cfg)
  if (pd && kvp?.do_remote_prefill === true) {
    const blocks = kvp.remote_block_ids
    // Before vLLM PR #29665 the connector had no remote_request_id: D notified P under its own request id
    // (the proxy sends one X-Request-Id on both legs). Since then D reads the id P returned.
    const remoteId = cfg.nixlLegacy ? id : kvp.remote_request_id
    const complete =
      Array.isArray(blocks) &&
      blocks.flat().length > 0 &&
      typeof kvp.remote_engine_id === "string" &&
      typeof remoteId === "string" &&
      typeof kvp.remote_host === "string" &&
      kvp.remote_port !== undefined &&
      kvp.remote_port !== null
    if (!complete) {
      ctx.localPrefills++
      ctx.log("Got invalid KVTransferParams; computing the prefill locally", { request_id: id })
    } else {
      const r = await fetchBlocks(
        String(kvp.remote_host),
        Number(kvp.remote_port),
        String(kvp.remote_engine_id),
        String(remoteId),
        blocks
      )
      if (gone()) return GONE
      if (!r.ok) {
        ctx.kvFetchFailures++
        const policy = cfg.kvTransferConfig?.kv_load_failure_policy ?? "recompute"
        ctx.log("KV load failed", {
          request_id: id,
          remote_request_id: remoteId,
          reason: r.reason,
          policy
        })
        // "fail": the scheduler finishes the request with finish_reason "error" once it was scheduled, and the
        // OpenAI layer raises GenerationError("Internal server error"): a stream already answered 200 carries it
        // as an error event (vllm/entrypoints/openai/serving_engine.py _raise_if_error,
        // _convert_generation_error_to_streaming_response; vllm-project/vllm#26813). The reason is only logged.
        if (policy === "fail") return { kind: "failInStream" }
        ctx.localPrefills++
      }
    }
  }
  return { kind: "proceed" }
}

/**
 * A vLLM prefill leg (`do_remote_decode`) that ended on its length: keeps the prompt's blocks for the decode
 * side to pull within the lease, and returns the kv_transfer_params for the response; null for every other
 * request, and for a prefill that ended any other way (a stop string, the end-of-sequence token), as the
 * NixlConnector hands off only a request that finished LENGTH_CAPPED (`request_finished`,
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
 */
export const holdForDecode = (
  ctx: SimContext,
  /** The block table of the rank that ran the prefill. */
  kv: KvBlocks,
  gr: GenRequest,
  id: string,
  admission: Admission,
  promptTokens: number,
  finishReason: string
): unknown => {
  const { cfg } = ctx
  const kvp = gr.kvTransferParams
  const pd = cfg.flavor === "vllm" && hasPdConnector(cfg)
  if (!(pd && kvp?.do_remote_decode === true && ctx.sideChannel !== undefined)) return null
  if (finishReason !== "length") return null
  const hashes = admission.hashes
  kv.retain(hashes)
  const extra = cfg.kvTransferConfig?.kv_connector_extra_config as Record<string, unknown> | undefined
  const leaseS = typeof extra?.kv_lease_duration === "number" ? extra.kv_lease_duration : 30
  ctx.sideChannel.hold(
    id,
    {
      engineId: ctx.engineId,
      blockIds: admission.blockIds,
      numTokens: promptTokens,
      release: () => kv.release(hashes)
    },
    cfg.kvLeaseMs ?? leaseS * 1000
  )
  return {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [admission.blockIds],
    remote_engine_id: ctx.engineId,
    ...(cfg.nixlLegacy ? {} : { remote_request_id: id }),
    remote_host: ctx.sideChannelHost,
    remote_port: ctx.sideChannelPort,
    tp_size: cfg.tensorParallel
  }
}
