// One request's life in the simulator: wait for the model (mlx lazy load), P/D hand-off, queue for a slot,
// prefix-cache admission (KV events), time to first token, tokens at the inter-token latency (streamed as
// SSE or collected), faults (stall, mid-stream error, reset), then release of the slot and the blocks.
// A client that disconnects at any point aborts the request and frees its slot.
import type * as http from "node:http"
import { DONE, fullBody, sse, streamTemplate } from "./chunks.ts"
import { hasPdConnector, type SimContext, sendError } from "./context.ts"
import { errorBody, LLAMA_ERROR_FIELD } from "./errors.ts"
import { fetchBlocks, waitForRoom } from "./pd.ts"
import type { GenRequest } from "./request.ts"
import { plan, prng, tokenId } from "./tokens.ts"

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))
const tick = (): Promise<void> => new Promise((r) => setImmediate(r))

/** Tokens written per event-loop turn when there is no inter-token latency. */
const BATCH = 32

export const generate = async (
  ctx: SimContext,
  gr: GenRequest,
  id: string,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  inject: "midstream" | "sse_error_field" | "reset" | undefined
): Promise<void> => {
  const { cfg, stats, kv } = ctx
  const t0 = performance.now()
  const abort = new AbortController()
  let state: "active" | "done" | "aborted" = "active"
  let cleanup = () => {}
  const closed = new Promise<void>((resolve) => {
    res.on("close", () => {
      if (state === "active" && !res.writableFinished) {
        state = "aborted"
        stats.aborted++
        abort.abort()
        cleanup()
      }
      resolve()
    })
  })
  void req
  const gone = () => state !== "active"

  if (!ctx.loaded) await Promise.race([ctx.whenLoaded, closed])
  if (gone()) return

  // SGLang decode: wait (bounded) for the prefill engine to finish this bootstrap room.
  if (cfg.flavor === "sglang" && cfg.disaggregationMode !== undefined && gr.bootstrap === undefined) {
    state = "done"
    return sendError(
      ctx,
      res,
      400,
      `bootstrap_host, bootstrap_port and bootstrap_room are required in ${cfg.disaggregationMode} mode`
    )
  }
  if (cfg.flavor === "sglang" && cfg.disaggregationMode === "decode" && gr.bootstrap !== undefined) {
    const b = gr.bootstrap
    const r = await waitForRoom(b.host, b.port, b.room, cfg.bootstrapTimeoutMs ?? 300_000, abort.signal)
    if (gone()) return
    if (!r.ok) {
      state = "done"
      ctx.log("kv transfer failed", { room: b.room, reason: r.reason })
      return sendError(ctx, res, 500, `KV transfer for bootstrap_room ${b.room} failed: ${r.reason}`)
    }
  }

  // SGLang prefill: held in the bootstrap queue until the decode side has connected for the room.
  if (cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" && gr.bootstrap !== undefined) {
    const room = gr.bootstrap.room
    const timeoutMs = cfg.bootstrapTimeoutMs ?? 300_000
    const connected = await (ctx.bootstrap?.waitForDecode(room, timeoutMs, abort.signal) ?? Promise.resolve(false))
    if (gone()) return
    if (!connected) {
      state = "done"
      ctx.log("bootstrap timed out", { room })
      return sendError(
        ctx,
        res,
        500,
        `Request ${id} timed out after ${timeoutMs / 1000}s in KVPoll.Bootstrapping (bootstrap_room ${room}): no decode server connected`
      )
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
      if (gone()) return
      if (!r.ok) {
        ctx.kvFetchFailures++
        const policy = cfg.kvTransferConfig?.kv_load_failure_policy ?? "recompute"
        ctx.log("KV load failed", {
          request_id: id,
          remote_request_id: remoteId,
          reason: r.reason,
          policy
        })
        if (policy === "fail") {
          state = "done"
          return sendError(ctx, res, 500, `KV load failed for request ${id}: ${r.reason}`)
        }
        ctx.localPrefills++
      }
    }
  }

  const ticket = ctx.scheduler.enter()
  let pinned: ReadonlyArray<bigint> = []
  let myDecodeBlocks = 0
  cleanup = () => {
    ticket.release()
    kv.release(pinned)
    ctx.decodeBlocks -= myDecodeBlocks
    myDecodeBlocks = 0
    pinned = []
  }
  await ticket.admitted
  if (gone()) return

  const promptIds = gr.promptWords.map(tokenId)
  const admission = kv.admit(promptIds, gr.cacheSalt)
  pinned = admission.hashes
  ctx.publisher?.publish(admission.events)
  stats.promptTokens += promptIds.length
  stats.prefixQueries += promptIds.length
  stats.prefixHits += admission.hitTokens
  // Blocks beyond the pinned full prompt blocks: the partial prompt block, then one per filled decode block.
  const fullPrompt = Math.floor(promptIds.length / kv.blockSize)
  const extraBlocks = (generated: number) => Math.ceil((promptIds.length + generated) / kv.blockSize) - fullPrompt
  myDecodeBlocks = extraBlocks(0)
  ctx.decodeBlocks += myDecodeBlocks

  if (cfg.ttftMs > 0) await Promise.race([sleep(cfg.ttftMs), closed])
  if (gone()) return
  const sglangPrefill = cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" && gr.bootstrap !== undefined
  if (sglangPrefill && gr.bootstrap !== undefined) ctx.bootstrap?.complete(gr.bootstrap.room)

  const rand = gr.seed === undefined ? ctx.rand : prng(gr.seed)
  const g = plan(cfg.mode, gr.promptWords, sglangPrefill ? 1 : gr.maxTokens, rand)
  const model = cfg.servedName
  const created = Math.floor(Date.now() / 1000)
  let last = performance.now()
  let emitted = 0
  const onToken = () => {
    const now = performance.now()
    if (emitted === 0) stats.ttft.observe((now - t0) / 1000)
    else stats.itl.observe((now - last) / 1000)
    last = now
    emitted++
    stats.generationTokens++
    const extra = extraBlocks(emitted)
    if (extra !== myDecodeBlocks) {
      ctx.decodeBlocks += extra - myDecodeBlocks
      myDecodeBlocks = extra
    }
  }
  const stallAt = () => ctx.faults.stallAfterTokens
  const stalled = () => {
    const s = stallAt()
    return s !== undefined && emitted >= s
  }
  const faultAt = inject === undefined ? Number.POSITIVE_INFINITY : Math.min(1, g.tokens.length)

  const finish = (reason: string) => {
    state = "done"
    const e2e = (performance.now() - t0) / 1000
    stats.e2e.observe(e2e)
    stats.finished(reason)
    let kvParams: unknown = null
    if (pd && kvp?.do_remote_decode === true && ctx.sideChannel !== undefined) {
      const hashes = admission.hashes
      kv.retain(hashes)
      const extra = cfg.kvTransferConfig?.kv_connector_extra_config as Record<string, unknown> | undefined
      const leaseS = typeof extra?.kv_lease_duration === "number" ? extra.kv_lease_duration : 30
      ctx.sideChannel.hold(
        id,
        {
          engineId: ctx.engineId,
          blockIds: admission.blockIds,
          numTokens: promptIds.length,
          release: () => kv.release(hashes)
        },
        cfg.kvLeaseMs ?? leaseS * 1000
      )
      kvParams = {
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
    cleanup()
    if (cfg.crashAfterRequests !== undefined && stats.served >= cfg.crashAfterRequests) {
      res.once("finish", () => ctx.crash(`crash after ${cfg.crashAfterRequests} requests`))
    }
    return kvParams
  }

  const usage = () => ({
    prompt_tokens: promptIds.length,
    total_tokens: promptIds.length + emitted,
    completion_tokens: emitted
  })

  if (gr.stream) {
    const tpl = streamTemplate(gr.endpoint, id, model, created, cfg.flavor)
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" })
    let out = tpl.first
    while (emitted < g.tokens.length) {
      if (stalled()) {
        if (out !== "") res.write(out)
        out = ""
        await closed
        return
      }
      if (emitted >= faultAt) {
        if (out !== "") res.write(out)
        return fault(ctx, res, inject, true, () => {
          state = "done"
          stats.finished("error")
          cleanup()
        })
      }
      out += tpl.token(g.tokens[emitted] ?? "")
      onToken()
      if (cfg.itlMs > 0) {
        res.write(out)
        out = ""
        await Promise.race([sleep(cfg.itlMs), closed])
        if (gone()) return
      } else if (emitted % BATCH === 0) {
        const ok = res.write(out)
        out = ""
        await (ok ? tick() : Promise.race([new Promise((r) => res.once("drain", r)), closed]))
        if (gone()) return
      }
    }
    finish(g.finishReason)
    out += tpl.end(g.finishReason, usage(), gr.includeUsage)
    res.end(out + DONE)
    return
  }

  let text = ""
  while (emitted < g.tokens.length) {
    if (stalled()) {
      await closed
      return
    }
    if (emitted >= faultAt) {
      return fault(ctx, res, inject, false, () => {
        state = "done"
        stats.finished("error")
        cleanup()
      })
    }
    text += g.tokens[emitted] ?? ""
    onToken()
    if (cfg.itlMs > 0) {
      await Promise.race([sleep(cfg.itlMs), closed])
      if (gone()) return
    }
  }
  const kvParams = finish(g.finishReason)
  const body = fullBody(cfg.flavor, gr.endpoint, id, model, created, text, g.finishReason, usage(), kvParams)
  const json = JSON.stringify(body)
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(json) })
  res.end(json)
}

/**
 * Mid-stream error or a connection reset. vLLM and SGLang send `data: {"error":...}` then `data: [DONE]`
 * (vllm/entrypoints/openai/serving_chat.py, python/sglang/srt/entrypoints/openai/serving_chat.py); current
 * llama.cpp sends `data: {"error":...}` and closes without [DONE]; older llama.cpp sent an `error: {...}` field
 * line (the flat code/message/type object) then `data: [DONE]` (tools/server/server.cpp, server_sent_event).
 */
const fault = (
  ctx: SimContext,
  res: http.ServerResponse,
  kind: "midstream" | "sse_error_field" | "reset" | undefined,
  streaming: boolean,
  done: () => void
): void => {
  done()
  if (kind === "reset") {
    if (!streaming) res.writeHead(200, { "content-type": "application/json", "content-length": 1000 })
    res.socket?.resetAndDestroy()
    return
  }
  const message = "simulated mid-stream engine failure"
  const body = errorBody(ctx.cfg.flavor, 500, message)
  if (streaming) {
    // llama-server ends the stream on an error event without `data: [DONE]`
    // (tools/server/server-context.cpp, "error received during streaming, terminating stream"); older builds
    // sent an SSE `error:` field line, then `data: [DONE]`.
    if (ctx.cfg.flavor !== "llama_cpp") res.end(sse(JSON.stringify(body)) + DONE)
    else if (kind === "sse_error_field") res.end(`error: ${JSON.stringify(LLAMA_ERROR_FIELD(message))}\n\n${DONE}`)
    else res.end(sse(JSON.stringify(body)))
    return
  }
  sendError(ctx, res, 500, "simulated engine failure")
}
