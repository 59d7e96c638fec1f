// The simulator's HTTP server (node:http, no framework, for speed): OpenAI endpoints, health, metrics and
// the /sim control plane per flavor, wired to the scheduler, the KV block manager, the KV-event publisher,
// the P/D hand-off and the fault switches. Generation itself lives in generate.ts.
import { randomUUID } from "node:crypto"
import type * as http from "node:http"
import { keyRefusal } from "./apiKey.ts"
import { modelsBody } from "./chunks.ts"
import { errorReply, llamaFraming, reply, type SimContext, sendError } from "./context.ts"
import { deadEngineRefusal } from "./engineDeath.ts"
import { LLAMA_LOADING, LLAMA_NO_METRICS, LLAMA_NOT_FOUND } from "./errors.ts"
import { schedulerAbort } from "./faultReply.ts"
import { applyFaults } from "./faults.ts"
import { generate } from "./generate.ts"
import { readBody, sendJson } from "./http.ts"
import { bareStatus, readJson } from "./jsonBody.ts"
import { llamaId } from "./llamaChunks.ts"
import { llamaRoute } from "./llamaRoutes.ts"
import { type Gauges, type RankMetrics, renderMetrics } from "./metrics.ts"
import type { Rank } from "./ranks.ts"
import { isInvalid, validate } from "./request.ts"
import { type SglangHealth, sglangHealth } from "./sglangHealth.ts"
import type { Flavor } from "./simConfig.ts"

const notFound = (ctx: SimContext, res: http.ServerResponse) => {
  switch (ctx.cfg.flavor) {
    case "vllm":
    case "sglang":
      return sendJson(res, 404, { detail: "Not Found" })
    case "llama_cpp":
      return reply(ctx, res, 404, LLAMA_NOT_FOUND)
    case "mlx": {
      // mlx-lm writes the bare text under a JSON content type (ml-explore/mlx-lm mlx_lm/server.py, do_GET, do_POST).
      res.writeHead(404, { "content-type": "application/json", "content-length": 9 })
      return void res.end("Not Found")
    }
  }
}

/**
 * One engine core's gauges. Each DP rank has a KV cache of its own, as large as a single engine's; its pins
 * also count blocks a vLLM prefill holds for its decode side after the request.
 */
const gauges = (ctx: SimContext, rank: Rank): Gauges => {
  const frozen = rank.core.frozenMetrics
  if (frozen !== undefined) return frozen
  const { capacity, blockSize } = rank.kv
  const used = rank.usedBlocks
  return {
    running: rank.scheduler.running,
    waiting: rank.scheduler.waiting,
    kvUsage: rank.kvUsage,
    usedTokens: used * blockSize,
    maxTotalTokens: capacity * blockSize,
    maxSeqs: ctx.cfg.maxSeqs
  }
}

const perRank = (ctx: SimContext): Array<RankMetrics> =>
  ctx.engines.ranks.map((r) => ({ stats: r.stats, gauges: gauges(ctx, r) }))

/** KV usage over the ranks, averaged as usage fractions are. */
const kvUsage = (ctx: SimContext): number => {
  const all = ctx.engines.ranks.map((r) => r.kvUsage)
  return all.reduce((a, b) => a + b, 0) / all.length
}

const simState = (ctx: SimContext) => ({
  flavor: ctx.cfg.flavor,
  ready: ctx.loaded,
  running: ctx.engines.running,
  waiting: ctx.engines.waiting,
  served: ctx.stats.served,
  aborted: ctx.stats.aborted,
  pid: process.pid,
  grandchildPid: ctx.grandchildPid,
  received: ctx.stats.received,
  healthChecks: ctx.stats.healthChecks,
  // Over all engine cores: usage averaged, cached blocks summed (each DP rank caches its own copy of a
  // prefix it served), the events' seq of the rank that published last; `ranks` has each one's own.
  kvUsage: kvUsage(ctx),
  kvCachedBlocks: ctx.kv.cachedBlocks,
  kvBlockSize: ctx.kv.blockSize,
  kvEventsSeq: ctx.publisher?.lastSeq ?? null,
  ranks: ctx.engines.ranks.map((r) => ({
    running: r.scheduler.running,
    waiting: r.scheduler.waiting,
    kvUsage: r.kvUsage,
    kvCachedBlocks: r.kv.cachedBlocks,
    kvEventsSeq: ctx.publisher === undefined ? null : ctx.publisher.rankLastSeq(r.index)
  })),
  kvHeld: ctx.sideChannel?.held ?? 0,
  kvFetched: ctx.sideChannel?.fetched ?? 0,
  kvExpired: ctx.sideChannel?.expired ?? 0,
  kvFetchFailures: ctx.kvFetchFailures,
  localPrefills: ctx.localPrefills,
  engineId: ctx.engineId,
  faults: { ...ctx.faults, stallAfterTokens: ctx.faults.stallAfterTokens ?? null }
})

/**
 * The health paths each engine serves, GET unless said: vLLM `/health` (vllm-project/vllm
 * vllm/entrypoints/serve/instrumentator/health.py) and SageMaker's `/ping`, GET and POST
 * (vllm/entrypoints/sagemaker/api_router.py, earlier routes.py); SGLang `/health` and `/health_generate`
 * (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py); llama-server `/health` and `/v1/health`
 * (ggml-org/llama.cpp tools/server/server.cpp); mlx-lm `/health` only (ml-explore/mlx-lm mlx_lm/server.py,
 * do_GET). Any other path is the flavor's 404 (llama-server's 503 while it loads).
 */
const HEALTH_PATHS: Record<Flavor, ReadonlySet<string>> = {
  vllm: new Set(["/health", "/ping"]),
  sglang: new Set(["/health", "/health_generate"]),
  llama_cpp: new Set(["/health", "/v1/health"]),
  mlx: new Set(["/health"])
}

const isHealth = (flavor: Flavor, method: string | undefined, path: string): boolean =>
  HEALTH_PATHS[flavor].has(path) && (method === "GET" || (flavor === "vllm" && path === "/ping" && method === "POST"))

const LLAMA_MODEL_LISTS = new Set(["/models", "/v1/models", "/api/tags"])

/**
 * llama-server's OpenAI routes (tools/server/server.cpp): chat also without the /v1 prefix, completions at
 * /v1/completions (its /completions and /completion answer llama.cpp's own format, not modelled).
 */
const endpointOf = (flavor: Flavor, path: string): "chat" | "completion" | undefined => {
  if (path === "/v1/chat/completions") return "chat"
  if (path === "/chat/completions" && (flavor === "mlx" || flavor === "llama_cpp")) return "chat"
  return path === "/v1/completions" ? "completion" : undefined
}

/**
 * llama-server answers an OPTIONS request to any path with the CORS headers and nothing else, before it
 * looks at the path or the model's state (tools/server/server-http.cpp, the pre-routing handler; defaults
 * of --cors-* in common/arg.cpp); the origin header it adds to every answer (llamaFraming).
 */
const llamaOptions = (res: http.ServerResponse): void => {
  res.writeHead(200, {
    "access-control-allow-credentials": "true",
    "access-control-allow-methods": "GET, POST, DELETE, OPTIONS",
    "access-control-allow-headers": "*",
    "content-type": "text/html",
    "content-length": 0
  })
  res.end()
}

/** The request listener. Health requests held by --sim-hang-health are parked in `hung`. */
export const handler =
  (ctx: SimContext, hung: Set<http.ServerResponse>) => (req: http.IncomingMessage, res: http.ServerResponse) => {
    const url = req.url ?? "/"
    const q = url.indexOf("?")
    const path = q >= 0 ? url.slice(0, q) : url
    const { flavor } = ctx.cfg
    if (flavor === "llama_cpp") llamaFraming(req, res)
    if (path.startsWith("/sim/")) return controlPlane(ctx, path, req, res)
    if (flavor === "llama_cpp" && req.method === "OPTIONS") return llamaOptions(res)
    // cpp-httplib answers HEAD with the GET route's headers (node:http sends no body for HEAD).
    const method = flavor === "llama_cpp" && req.method === "HEAD" ? "GET" : req.method
    if (isHealth(flavor, method, path)) {
      if (ctx.faults.hangHealth) {
        hung.add(res)
        res.on("close", () => hung.delete(res))
        return
      }
      return health(ctx, path, res)
    }
    // Newer llama-server builds let the model list through while loading, with `"meta": null`
    // (llama.cpp tools/server/server-http.cpp, middleware_server_state); the bundled one answers 503.
    // llama_cpp: the model's training context (its GGUF header's) where the simulator could read it
    const modelList = () =>
      modelsBody(
        flavor,
        ctx.cfg.servedName,
        ctx.cfg.model,
        ctx.cfg.nCtxTrain ?? ctx.cfg.maxModelLen,
        ctx.created,
        ctx.cfg.slotContext
      )
    const listWhileLoading = ctx.cfg.modelsWhileLoading && LLAMA_MODEL_LISTS.has(path)
    if (!ctx.loaded && flavor === "llama_cpp" && !listWhileLoading) return reply(ctx, res, 503, LLAMA_LOADING)
    // The API key: after llama-server's loading check (its pre-routing handler's order), before any route
    const refusal = keyRefusal(flavor, ctx.cfg.apiKeys, req.method, path, req.headers)
    if (refusal !== undefined) return reply(ctx, res, 401, refusal)
    if (!ctx.loaded && flavor === "llama_cpp") {
      const body = modelList() as { data: Array<Record<string, unknown>> }
      for (const entry of body.data) entry.meta = null
      return reply(ctx, res, 200, body)
    }
    const models = path === "/v1/models" || (flavor === "llama_cpp" && path === "/models")
    if (method === "GET" && models) return reply(ctx, res, 200, modelList())
    if (method === "GET" && path === "/metrics") return void metrics(ctx, res)
    if (flavor === "vllm" && req.method === "GET" && path === "/version")
      return sendJson(res, 200, { version: "0.26.0-sim" })
    if (flavor === "llama_cpp" && llamaRoute(ctx, method, path, q < 0 ? "" : url.slice(q), req, res)) return
    if (req.method === "POST") {
      const endpoint = endpointOf(flavor, path)
      if (endpoint !== undefined) return void completion(ctx, endpoint, req, res)
    }
    notFound(ctx, res)
  }

const metricsText = (ctx: SimContext): string | undefined => {
  const page = { model: ctx.cfg.servedName, disaggregationMode: ctx.cfg.disaggregationMode }
  return ctx.cfg.enableMetrics ? renderMetrics(ctx.cfg.flavor, page, perRank(ctx)) : undefined
}

/** /metrics: what a wedged core last published, or (llama-server, whose loop answers it) once the core runs again. */
const metrics = async (ctx: SimContext, res: http.ServerResponse): Promise<void> => {
  const llama = ctx.cfg.flavor === "llama_cpp"
  // llama-server's handler refuses before it posts a task to its loop: at once, and no task id
  if (llama && !ctx.cfg.enableMetrics) return sendError(ctx, res, 501, LLAMA_NO_METRICS)
  if (ctx.core.wedged && llama) await ctx.core.running()
  const text = ctx.core.wedged ? ctx.core.frozenMetrics : metricsText(ctx)
  if (text === undefined) return notFound(ctx, res)
  // llama-server's /metrics is a task of its loop (METRICS): it takes a task id (llamaSlots.ts)
  if (llama && !ctx.core.wedged) ctx.engines.ranks[0]?.slotBook.taskId()
  // llama-server: its start time (SimContext.monotonicStartUs) and a content type with no charset (server-context.cpp)
  res.writeHead(200, {
    ...(llama ? { "Process-Start-Time-Unix": ctx.monotonicStartUs } : {}),
    "content-type": `text/plain; version=0.0.4${llama ? "" : "; charset=utf-8"}`,
    "content-length": Buffer.byteLength(text)
  })
  res.end(text)
}

const health = (ctx: SimContext, path: string, res: http.ServerResponse) => {
  switch (ctx.cfg.flavor) {
    case "vllm":
      res.writeHead(ctx.faults.engineDead ? 503 : 200, { "content-length": 0 })
      return void res.end()
    case "sglang":
      if (!ctx.loaded) return sendJson(res, 503, undefined)
      return sglangHealth(
        ctx.cfg.sglangHealth as SglangHealth,
        path,
        { runs: () => !ctx.core.wedged, generated: () => void ctx.stats.healthChecks++ },
        res
      )
    case "llama_cpp":
      return ctx.loaded ? reply(ctx, res, 200, { status: "ok" }) : reply(ctx, res, 503, LLAMA_LOADING)
    case "mlx":
      return sendJson(res, 200, { status: "ok" })
  }
}

const controlPlane = (ctx: SimContext, path: string, req: http.IncomingMessage, res: http.ServerResponse) => {
  if (req.method === "GET" && path === "/sim/state") return sendJson(res, 200, simState(ctx))
  if (req.method === "POST" && path === "/sim/faults") {
    readBody(req)
      .then((text) => {
        const out = applyFaults(ctx.faults, JSON.parse(text === "" ? "{}" : text))
        if (out.error !== undefined) return sendJson(res, 400, { error: out.error })
        if (ctx.faults.wedged) ctx.core.wedge(metricsText(ctx))
        else ctx.core.unwedge()
        for (const r of ctx.engines.ranks)
          if (r.index === ctx.faults.wedgedRank) r.core.wedge(gauges(ctx, r))
          else r.core.unwedge()
        ctx.log("faults changed", { faults: ctx.faults, crashNow: out.crashNow })
        sendJson(res, 200, { faults: ctx.faults })
        if (out.crashNow) res.on("finish", () => ctx.crash("crashNow via /sim/faults"))
      })
      .catch((err: unknown) => sendJson(res, 400, { error: String(err) }))
    return
  }
  sendJson(res, 404, { error: "unknown control path" })
}

const completion = async (
  ctx: SimContext,
  endpoint: "chat" | "completion",
  req: http.IncomingMessage,
  res: http.ServerResponse
): Promise<void> => {
  const { flavor } = ctx.cfg
  if (flavor === "mlx" && req.headers["content-length"] === undefined) {
    req.resume()
    return sendJson(res, 411, { error: "Content-Length header is required" })
  }
  // SGLang answers /health 503 while it warms up but takes completions all along (its routes call
  // handle_request with no status check: sgl-project/sglang python/sglang/srt/entrypoints/http_server.py):
  // a request that races readiness waits in generate for the load, as mlx-lm's does.
  const read = await readJson(flavor, req)
  if ("bare" in read) return bareStatus(res, read.bare)
  if ("message" in read)
    return read.reply === undefined
      ? sendError(ctx, res, read.status, read.message)
      : errorReply(ctx, res, read.status, read.reply)
  const parsed = validate(ctx.cfg, endpoint, read.body, read.raw)
  if (deadEngineRefusal(ctx, parsed, res)) return
  if (isInvalid(parsed)) {
    if (parsed.drop === true) {
      // mlx-lm: socketserver prints the traceback and closes the connection (ThreadingHTTPServer handle_error,
      // shutdown_request); the client gets no response at all
      ctx.log("Exception occurred during processing of request", { error: `ValueError: ${parsed.message}` })
      req.socket.end()
      return
    }
    if (parsed.body !== undefined) return errorReply(ctx, res, parsed.status, parsed.body)
    if (parsed.schedulerAbort) return schedulerAbort(ctx, res, parsed.message, parsed.schedulerAbort.stream)
    return sendError(ctx, res, parsed.status, parsed.message, parsed.param)
  }
  for (const w of parsed.warnings ?? []) ctx.log(w, { level: "warning" })
  ctx.stats.received++
  const { faults } = ctx
  let inject: "midstream" | "sse_error_field" | "reset" | undefined
  if (faults.errorRate > 0 && ctx.rand() < faults.errorRate) {
    const kind = faults.errorKind
    if (kind === "midstream" || kind === "sse_error_field" || kind === "reset") inject = kind
    else {
      const status = Number(kind.slice(4))
      return sendError(ctx, res, status, `simulated error (${kind})`)
    }
  }
  const requestId = req.headers["x-request-id"]
  const id =
    flavor === "llama_cpp"
      ? llamaId()
      : `${endpoint === "chat" ? "chatcmpl" : "cmpl"}-${typeof requestId === "string" ? requestId : randomUUID().replaceAll("-", "")}`
  await generate(ctx, parsed, id, req, res, inject)
}
