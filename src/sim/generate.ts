// One request's life in the simulator: wait for the model (mlx lazy load), P/D hand-off (pdLegs.ts), queue
// for a slot, prefix-cache admission (KV events), time to first token, tokens at the inter-token latency
// (streamed as SSE or collected), faults (stall; mid-stream error and reset: faultReply.ts), then release of
// the slot and the blocks. A client that disconnects at any point aborts the request and frees its slot.
import type * as http from "node:http"
import { DONE, fullBody, streamTemplate } from "./chunks.ts"
import { type SimContext, sendError } from "./context.ts"
import { fault } from "./faultReply.ts"
import { handoffBeforeGeneration, holdForDecode } from "./pdLegs.ts"
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
  const { cfg, stats } = ctx
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

  const handoff = await handoffBeforeGeneration(ctx, gr, id, abort.signal, gone)
  if (handoff.kind === "gone") return
  if (handoff.kind === "error") {
    state = "done"
    return sendError(ctx, res, handoff.status, handoff.message)
  }

  // The engine core (DP rank) that runs it: its slot, its prefix cache and KV events, its counters.
  const rank = ctx.engines.pick({ bootstrapRoom: gr.bootstrap?.room })
  const { kv, stats: rs } = rank
  const ticket = rank.scheduler.enter()
  let pinned: ReadonlyArray<bigint> = []
  let myDecodeBlocks = 0
  cleanup = () => {
    ticket.release()
    kv.release(pinned)
    rank.decodeBlocks -= myDecodeBlocks
    myDecodeBlocks = 0
    pinned = []
  }
  await ticket.admitted
  if (gone()) return

  const promptIds = gr.promptWords.map(tokenId)
  const admission = kv.admit(promptIds, gr.cacheSalt)
  pinned = admission.hashes
  // Each DP rank publishes its own cache's events on its own publisher (kvpublisher.ts).
  ctx.publisher?.publish(admission.events, rank.index)
  rs.promptTokens += promptIds.length
  rs.prefixQueries += promptIds.length
  rs.prefixHits += admission.hitTokens
  // Blocks beyond the pinned full prompt blocks: the partial prompt block, then one per filled decode block.
  const fullPrompt = Math.floor(promptIds.length / kv.blockSize)
  const extraBlocks = (generated: number) => Math.ceil((promptIds.length + generated) / kv.blockSize) - fullPrompt
  myDecodeBlocks = extraBlocks(0)
  rank.decodeBlocks += myDecodeBlocks

  if (cfg.ttftMs > 0) await Promise.race([sleep(cfg.ttftMs), closed])
  if (gone()) return
  const sglangPrefill = cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" && gr.bootstrap !== undefined
  if (sglangPrefill && gr.bootstrap !== undefined) ctx.bootstrap?.complete(gr.bootstrap.room)

  const rand = gr.seed === undefined ? ctx.rand : prng(gr.seed)
  const g = plan(cfg.mode, gr.promptWords, sglangPrefill ? 1 : gr.maxTokens, rand, gr.ignoreEos)
  const model = cfg.servedName
  const created = Math.floor(Date.now() / 1000)
  let last = performance.now()
  let emitted = 0
  const onToken = () => {
    const now = performance.now()
    if (emitted === 0) rs.ttft.observe((now - t0) / 1000)
    else rs.itl.observe((now - last) / 1000)
    last = now
    emitted++
    rs.generationTokens++
    const extra = extraBlocks(emitted)
    if (extra !== myDecodeBlocks) {
      rank.decodeBlocks += extra - myDecodeBlocks
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
    rs.e2e.observe(e2e)
    rs.finished(reason)
    stats.served++
    const kvParams = holdForDecode(ctx, kv, gr, id, admission, promptIds.length, reason)
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
    let last: string | undefined
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
          rs.finished("error")
          stats.served++
          cleanup()
        })
      }
      const piece = g.tokens[emitted] ?? ""
      if (tpl.finishWithLastToken && emitted === g.tokens.length - 1) {
        // The last token travels with the finish reason (chunks.ts, mergesFinish).
        last = piece
        onToken()
        break
      }
      out += tpl.token(piece)
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
    out += tpl.end(g.finishReason, usage(), gr.includeUsage, last)
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
        rs.finished("error")
        stats.served++
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
