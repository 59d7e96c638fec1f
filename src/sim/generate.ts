// One request's life in the simulator: wait for the model (mlx lazy load), P/D hand-off (pdLegs.ts), queue
// for a slot, prefix-cache admission (KV events), time to first token, tokens at the inter-token latency a step
// (streamed as SSE or collected), faults (stall; mid-stream error and reset: faultReply.ts; the wedged core:
// wedge.ts), then release of the slot and the blocks. A client that disconnects at any point aborts the request and
// frees its slot (once the core runs: a wedged one never sees the abort), but where llama-server keeps it (below).
import type * as http from "node:http"
import { setTimeout as sleep, setImmediate as tick } from "node:timers/promises"
import { DONE, fullBody, streamTemplate, type Usage } from "./chunks.ts"
import { jsonHeaders, type SimContext, sendError, sseHeaders } from "./context.ts"
import { dpPin } from "./dpPin.ts"
import { fault, type Injected, plannedFault } from "./faultReply.ts"
import { sendJson } from "./http.ts"
import { llamaFullBody } from "./llamaChunks.ts"
import { handoffBeforeGeneration, holdForDecode } from "./pdLegs.ts"
import { type GenRequest, type Sequence, sequenceUsage } from "./request.ts"
import { RequestBlocks } from "./requestBlocks.ts"
import { RequestSlots } from "./requestSlots.ts"
import { LlamaStops, type SeqEvent, sequenceEvents } from "./sequences.ts"
import { pingUntil } from "./ssePing.ts"
import { stopMatcher } from "./stopRules.ts"
import { plan, prng, promptSeed, tokenId } from "./tokens.ts"
import type { Core } from "./wedge.ts"

/** Tokens written per event-loop turn when there is no inter-token latency. */
const BATCH = 32

export const generate = async (
  ctx: SimContext,
  gr: GenRequest,
  id: string,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  inject: Injected | undefined
): Promise<void> => {
  const { cfg, stats } = ctx
  const t0 = performance.now()
  const abort = new AbortController()
  let state: "active" | "done" | "aborted" = "active"
  let cleanup = () => {}
  /** The core of the rank that runs it, once picked: it can hang alone (wedge.ts, `wedged_rank`). */
  let rankCore: Core<unknown> | undefined
  const wedged = () => ctx.core.wedged || rankCore?.wedged === true
  // llama-server generates a whole (non-streamed) answer to its end though its client left, from its slot on (its
  // prompt processing included): the slot stays busy and the tokens are counted (measured against the real server).
  // Streamed answers stop at once, as in every engine.
  let inSlot = false
  let detached = false
  // llama-server also keeps a request its client left while it waited for a slot: it takes the slot when one frees,
  // its prompt evaluated for nobody; a stream is dropped at its first result (that token counted), a whole answer
  // generated to its end (ggml-org/llama.cpp#13262; measured: the real one's requests_deferred stays up meanwhile).
  let waitingForSlot = false
  let leftInQueue = false
  const closed = new Promise<void>((resolve) => {
    res.on("close", () => {
      const kept = inSlot || waitingForSlot
      if (state === "active" && !res.writableFinished && kept && cfg.flavor === "llama_cpp" && !gr.stream) {
        detached = true
      } else if (state === "active" && !res.writableFinished && waitingForSlot && cfg.flavor === "llama_cpp") {
        leftInQueue = true
      } else if (state === "active" && !res.writableFinished) {
        state = "aborted"
        stats.aborted++
        abort.abort()
        ctx.core.whenRunning(() => (rankCore === undefined ? cleanup() : rankCore.whenRunning(() => cleanup())))
      }
      resolve()
    })
  })
  const gone = () => state !== "active"
  /** Waits `ms` (the TTFT, a decode step; a detached answer too); false once the client has gone meanwhile. */
  const waited = async (ms: number): Promise<boolean> => {
    if (ms > 0) await (detached ? sleep(ms) : Promise.race([sleep(ms), closed]))
    return !gone()
  }
  /** Waits for a slot on a `wait` event, then while the core is wedged; false once the client has gone meanwhile. */
  const coreRuns = async (ev?: SeqEvent): Promise<boolean> => {
    if (ev?.kind === "wait") await (detached ? ev.until : Promise.race([ev.until, closed]))
    while (wedged() && !gone()) {
      const runs = (ctx.core.wedged ? ctx.core : (rankCore as Core<unknown>)).running()
      // A detached whole answer (llama_cpp) waits for the core alone: `closed` has resolved.
      await (detached ? runs : Promise.race([runs, closed]))
    }
    return !gone()
  }

  if (!ctx.loaded) await Promise.race([ctx.whenLoaded, closed])
  if (gone()) return
  // the rank a client named (dpPin.ts), refused out of range before anything else runs
  const pinnedTo = dpPin(cfg.flavor, req.headers, gr.routedDpRank, ctx.engines.ranks.length)
  if (typeof pinnedTo === "object") {
    state = "done"
    return sendError(ctx, res, 400, pinnedTo.refused)
  }

  const handoff = await handoffBeforeGeneration(ctx, gr, id, abort.signal, gone)
  if (handoff.kind === "gone") return
  if (handoff.kind === "error") {
    state = "done"
    return sendError(ctx, res, handoff.status, handoff.message)
  }

  // The DP rank that runs it (its slot, prefix cache, KV events, counters); llama.cpp's sequences: requestSlots.ts.
  const rank = ctx.engines.pick({ bootstrapRoom: gr.bootstrap?.room }, pinnedTo)
  rankCore = rank.core
  const { kv, stats: rs } = rank
  const slots = new RequestSlots(cfg, rank, gr)
  let blocks: RequestBlocks | undefined
  let myDecodeBlocks = 0
  cleanup = () => {
    if (state === "aborted") rs.aborted++ // the rank's count of requests its clients left (metricPages.ts)
    slots.release()
    if (blocks !== undefined) kv.release(blocks.pinned)
    rank.decodeBlocks -= myDecodeBlocks
    myDecodeBlocks = 0
    blocks = undefined
  }
  waitingForSlot = true
  await slots.first
  waitingForSlot = false
  inSlot = true
  if (gone() || (wedged() && !(await coreRuns()))) return

  const promptIds = gr.promptWords.map(tokenId)
  const admission = kv.admit(promptIds, gr.cacheSalt)
  const held = new RequestBlocks(kv, cfg.flavor, promptIds, admission, gr.cacheSalt)
  blocks = held
  // Each DP rank publishes its own cache's events on its own publisher (kvpublisher.ts).
  ctx.publisher?.publish(admission.events, rank.index)
  rs.prefixQueries += promptIds.length
  rs.prefixHits += admission.hitTokens
  // Blocks beyond the pinned full ones: the partial block, and filled ones the engine has not cached.
  const heldLoose = () => {
    rank.decodeBlocks += held.loose - myDecodeBlocks
    myDecodeBlocks = held.loose
  }
  heldLoose()
  if (leftInQueue) {
    if (cfg.ttftMs > 0) await sleep(cfg.ttftMs)
    rs.firstTokenForNobody(gone, gr.sequences[0]?.promptTokens ?? 0, promptIds.length)
    state = "aborted"
    stats.aborted++
    cleanup()
    return
  }

  if (!(await waited(cfg.ttftMs))) return
  const sglangPrefill = cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" && gr.bootstrap !== undefined
  // The fake sender (SGLang's own warm-up) hands nothing to the bootstrap server.
  if (sglangPrefill && gr.bootstrap?.fake === false) ctx.bootstrap?.complete(gr.bootstrap.room)

  const rand = (q: Sequence) =>
    gr.greedy === true ? prng(promptSeed(q.tokens ?? q.words)) : q.seed === undefined ? ctx.rand : prng(q.seed)
  const llama = cfg.flavor === "llama_cpp"
  const maxOf = (q: Sequence) => (sglangPrefill ? 1 : q.maxTokens)
  const plans = gr.sequences.map((q) => plan(cfg.mode, q.words, maxOf(q), rand(q), gr.ignoreEos, llama))
  const model = gr.echoModel ?? cfg.servedName
  const created = Math.floor(Date.now() / 1000)
  let last = performance.now()
  let emitted = 0
  const onToken = (text: string) => {
    const now = performance.now()
    if (emitted === 0) {
      rs.ttft.observe((now - t0) / 1000)
      // the prompt counts as prefilled with its first token (Stats)
      rs.promptTokens += promptIds.length
      rs.prefilledHits += admission.hitTokens
    } else rs.itl.observe((now - last) / 1000)
    last = now
    emitted++
    rs.generationTokens++
    // llama-server's decode steps (Stats.decoded): this request's sequences still generating share a step
    rs.decoded(gone, gr.sequences[0]?.promptTokens ?? 0, slots.generating())
    ctx.publisher?.publish(held.token(tokenId(text.trimStart())), rank.index)
    heldLoose()
  }
  const stalled = () => emitted >= (ctx.faults.stallAfterTokens ?? Number.POSITIVE_INFINITY)
  const planned = plannedFault(ctx, handoff.kind === "failInStream", inject)

  const finish = (reason: string) => {
    state = "done"
    const e2e = (performance.now() - t0) / 1000
    rs.e2e.observe(e2e)
    rs.finished(reason)
    rs.finishedPromptTokens += promptIds.length
    rs.finishedGenerationTokens += emitted
    rs.finishedCachedTokens += admission.hitTokens
    stats.served++
    ctx.publisher?.publish(held.finish(), rank.index)
    const kvParams = holdForDecode(ctx, kv, gr, id, admission, promptIds.length, reason)
    cleanup()
    if (cfg.crashAfterRequests !== undefined && stats.served >= cfg.crashAfterRequests) {
      res.once("finish", () => ctx.crash(`crash after ${cfg.crashAfterRequests} requests`))
    }
    return kvParams
  }
  const failed = () => {
    state = "done"
    rs.finished("error")
    stats.served++
    cleanup()
  }

  const usage = (index: number, generated: number): Usage => sequenceUsage(gr, index, generated)
  const flavor = cfg.flavor
  const prompt = { promptTokens: gr.sequences[0]?.promptTokens ?? 0, cachedTokens: admission.hitTokens }
  const events = sequenceEvents(
    plans,
    flavor === "llama_cpp" ? () => new LlamaStops(gr.stop, gr.assistantPrefill) : () => stopMatcher(flavor, gr),
    slots
  )
  const ends: Array<{ reason: string; content: string; generated: number; matched: string | undefined }> = []

  // A decode step's delay comes before the next step's tokens, not after the last: a task's finish goes with its last
  // token (send_final_response), and a later task's wait for its slot and prompt stands for the step it starts in.
  let stepDone = false
  const stepPaid = async (): Promise<boolean> => {
    const owed = stepDone
    stepDone = false
    return !owed || waited(cfg.itlMs)
  }
  if (gr.stream) {
    const tpl = streamTemplate(gr.endpoint, id, model, created, cfg.flavor, {
      ...prompt,
      continuousUsage: gr.continuousUsage === true,
      // a task that holds its slot already begins before the first token, a later one as it takes its slot
      llama: gr.llama && { ...gr.llama, slots: slots.holding() }
    })
    res.writeHead(200, sseHeaders(cfg.flavor))
    let out = tpl.first
    let held: string | undefined
    for (const ev of events) {
      // a later task's begin, as it takes its slot (its prompt's TTFT to come): out with what follows it
      if (ev.kind === "begin") {
        out += tpl.begin?.(ev.index) ?? ""
        continue
      }
      if (wedged() || ev.kind === "wait") {
        // what the core sent before it hung, or before its next task waits for a slot, is on the wire
        if (out !== "") res.write(out)
        out = ""
        if (ev.kind === "wait") stepDone = false
        if (!(await coreRuns(ev))) return
        if (ev.kind === "wait") continue
      }
      if (ev.kind === "end") {
        ends[ev.index] = ev
        const all = ends.filter((e) => e !== undefined).length === plans.length
        // a fault its tokens did not reach (one token, a stop string at the first) comes before the finish
        if (all && planned.kind !== undefined) return fault(ctx, res, planned.kind, true, failed, planned.message, out)
        if (all) finish(ev.reason)
        // What the engine held back goes with the finish (mlx-lm's held stop prefix at max_tokens).
        const last = held !== undefined ? held + ev.rest : ev.rest !== "" ? ev.rest : undefined
        out += tpl.end(ev.reason, usage(ev.index, ev.generated), gr.includeUsage, last, ev.index, ev.matched)
        held = undefined
        continue
      }
      if (stepDone) {
        res.write(out)
        out = ""
      }
      if (!(await stepPaid())) return
      if (stalled()) {
        if (out !== "") res.write(out)
        // llama-server pings only once its first chunk is out (the first result is awaited without).
        await pingUntil(res, emitted > 0 ? gr.ssePingMs : undefined, gone, closed)
        return
      }
      if (emitted >= planned.at) return fault(ctx, res, planned.kind, true, failed, planned.message, out)
      onToken(ev.text)
      // The last token travels with the finish reason (chunks.ts, mergesFinish).
      if (tpl.finishWithLastToken && ev.last) held = ev.text
      else out += tpl.token(ev.text, { ...ev, usage: usage(ev.index, ev.generated) })
      if (cfg.itlMs > 0 && ev.stepEnd) {
        res.write(out)
        out = ""
        stepDone = true
      } else if (emitted % BATCH === 0) {
        const ok = res.write(out)
        out = ""
        await (ok ? tick() : Promise.race([new Promise((r) => res.once("drain", r)), closed]))
        if (gone()) return
      }
    }
    // llama-server closes a streamed answer's connection after its last chunk (a half-close), though its headers
    // say keep-alive; a whole answer's it keeps (measured: test/real/sim-differential.test.ts)
    const socket = res.socket
    res.end(out + DONE, flavor === "llama_cpp" ? () => socket?.end() : undefined)
    return
  }

  for (const ev of events) {
    if (ev.kind === "wait") stepDone = false
    if ((wedged() || ev.kind === "wait") && !(await coreRuns(ev))) return
    if (ev.kind === "wait" || ev.kind === "begin") continue
    if (ev.kind === "end") {
      ends[ev.index] = ev
      continue
    }
    if (!(await stepPaid())) return
    if (stalled()) {
      await closed
      if (detached) cleanup()
      return
    }
    if (emitted >= planned.at) return fault(ctx, res, planned.kind, false, failed, planned.message)
    onToken(ev.text)
    stepDone = cfg.itlMs > 0 && ev.stepEnd
  }
  if (planned.kind !== undefined) return fault(ctx, res, planned.kind, false, failed, planned.message)
  const e0 = ends[0] ?? { reason: "length", content: "", generated: 0, matched: undefined }
  const kvParams = finish(e0.reason)
  if (detached) return
  const sequences = ends.map((e) => ({ text: e.content, finishReason: e.reason }))
  const body =
    flavor === "llama_cpp"
      ? llamaFullBody(gr, id, model, created, sequences, usage(0, e0.generated))
      : fullBody(flavor, gr.endpoint, id, model, created, e0, usage(0, e0.generated), kvParams, prompt)
  sendJson(res, 200, body, jsonHeaders(cfg.flavor))
}
