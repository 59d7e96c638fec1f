// Shared state of one simulator process (SimContext) and the response helpers every handler uses.
import { randomUUID } from "node:crypto"
import type * as http from "node:http"
import { MODELLED_METHODS, SglangDpController } from "./dpController.ts"
import { errorBody, legacyVllm } from "./errors.ts"
import { type Faults, initialFaults } from "./faults.ts"
import { ggufContextLength } from "./ggufMeta.ts"
import { sendJson } from "./http.ts"
import type { KvPublisher } from "./kvpublisher.ts"
import { llamaSlotContext } from "./llamaContext.ts"
import { Bootstrap, SideChannel } from "./pd.ts"
import { type Balancer, Engines, KvCaches } from "./ranks.ts"
import type { Flavor, SimConfig } from "./simConfig.ts"
import { readSpmVocab } from "./spmVocab.ts"
import { Stats } from "./stats.ts"
import { prng } from "./tokens.ts"
import { Core } from "./wedge.ts"

export type Log = (msg: string, fields?: Record<string, unknown>) => void

/** Everything a request handler touches. */
export interface SimContext {
  readonly cfg: SimConfig
  readonly log: Log
  /** Process-wide request counts (received, aborted, served); token counters and histograms are per rank. */
  readonly stats: Stats
  /** The engine cores: one, or vLLM's `--data-parallel-size` / SGLang's `--dp-size` ranks. */
  readonly engines: Engines
  /** The ranks' KV caches together (block size, totals, clearing all at load); a request uses its rank's `kv`. */
  readonly kv: KvCaches
  readonly faults: Faults
  /** Whether the engine core runs or hangs (the `wedged` fault). */
  readonly core: Core
  readonly rand: () => number
  readonly created: number
  /**
   * llama-server's `Process-Start-Time-Unix` on /metrics: not a Unix time but its monotonic clock at start, in µs
   * (server_metrics::init, `t_start = ggml_time_us()`, tools/server/server-context.cpp); node's hrtime is that clock.
   */
  readonly monotonicStartUs: string
  readonly engineId: string
  readonly sideChannel: SideChannel | undefined
  readonly sideChannelHost: string
  readonly sideChannelPort: number
  readonly bootstrap: Bootstrap | undefined
  readonly crash: (reason: string) => void
  /** vLLM's terminate_if_errored, called as a request meets a dead engine (engineDeath.ts); a no-op elsewhere. */
  engineErrored: () => void
  publisher: KvPublisher | undefined
  loaded: boolean
  whenLoaded: Promise<void>
  grandchildPid: number | null
  localPrefills: number
  kvFetchFailures: number
}

const OFFLOAD_ONLY = new Set([
  "OffloadingConnector",
  "LMCacheConnectorV1",
  "LMCacheMPConnector",
  "SimpleCPUOffloadConnector"
])

/**
 * Each engine's data parallelism (none: one rank whatever the line says): how a request's rank is chosen
 * (undefined: vLLM's API-server balancer, the Engines default) and whether the ranks hash a prompt alike
 * without PYTHONHASHSEED (SGLang's page hashes are content hashes; vLLM's NONE_HASH is drawn per engine core).
 */
const DATA_PARALLEL: Record<
  Flavor,
  { balancer: (cfg: SimConfig) => Balancer | undefined; sameHashes: boolean } | undefined
> = {
  vllm: { balancer: () => undefined, sameHashes: false },
  sglang: { balancer: (cfg) => new SglangDpController(cfg.loadBalanceMethod ?? "round_robin"), sameHashes: true },
  llama_cpp: undefined,
  mlx: undefined
}

/** Whether --kv-transfer-config configures a P/D connector (vLLM). */
export const hasPdConnector = (cfg: SimConfig): boolean => {
  const c = cfg.kvTransferConfig?.kv_connector
  return typeof c === "string" && !OFFLOAD_ONLY.has(c)
}

/** llama_cpp: the model file's training context, which caps (and without -c sets) a slot's (llamaContext.ts). */
const withTrainingContext = (cfg: SimConfig): SimConfig => {
  const nCtxTrain = cfg.llamaContext === undefined ? undefined : ggufContextLength(cfg.model)
  if (cfg.llamaContext === undefined || nCtxTrain === undefined) return cfg
  const vocab = readSpmVocab(cfg.model)
  return { ...cfg, nCtxTrain, slotContext: llamaSlotContext(cfg.llamaContext, nCtxTrain), vocab }
}

export const makeContext = (
  given: SimConfig,
  log: Log,
  crash: (reason: string) => void,
  env: Record<string, string | undefined>
): SimContext => {
  const cfg = withTrainingContext(given)
  const seedHash = (BigInt(cfg.seed >>> 0) << 32n) | BigInt(Number(env.PYTHONHASHSEED ?? "0") >>> 0)
  const engineId = cfg.kvTransferConfig?.engine_id
  const id = typeof engineId === "string" ? engineId : randomUUID()
  const dp = DATA_PARALLEL[cfg.flavor]
  const method = cfg.loadBalanceMethod
  if (dp !== undefined && cfg.dataParallel > 1 && method !== undefined && !MODELLED_METHODS.has(method))
    log("load balance method not modelled; routing round robin", { loadBalanceMethod: method })
  const engines = new Engines({
    dataParallel: dp === undefined ? 1 : cfg.dataParallel,
    maxSeqs: cfg.maxSeqs,
    blockSize: cfg.blockSize,
    kvBlocks: cfg.kvBlocks,
    seed: seedHash ^ 0x5bd1e9955bd1e995n,
    sharedSeed: dp?.sameHashes === true || env.PYTHONHASHSEED !== undefined,
    balancer: dp?.balancer(cfg)
  })
  return {
    cfg,
    log,
    stats: new Stats(),
    engines,
    kv: new KvCaches(engines.ranks),
    faults: initialFaults(cfg),
    core: new Core(),
    rand: prng(cfg.seed),
    created: Math.floor(Date.now() / 1000),
    monotonicStartUs: String(process.hrtime.bigint() / 1000n),
    engineId: id,
    sideChannel: cfg.flavor === "vllm" && hasPdConnector(cfg) ? new SideChannel(id, cfg.kvBlocks, log) : undefined,
    sideChannelHost: env.VLLM_NIXL_SIDE_CHANNEL_HOST ?? "localhost",
    sideChannelPort: Number(env.VLLM_NIXL_SIDE_CHANNEL_PORT ?? "5600"),
    bootstrap: cfg.flavor === "sglang" && cfg.disaggregationMode === "prefill" ? new Bootstrap() : undefined,
    crash,
    engineErrored: () => {},
    publisher: undefined,
    loaded: false,
    whenLoaded: Promise.resolve(),
    grandchildPid: null,
    localPrefills: 0,
    kvFetchFailures: 0
  }
}

/**
 * The headers of a JSON answer beyond the defaults. llama-server (cpp-httplib) says `application/json;
 * charset=utf-8` and closes the connection after any status from 400 on ("Don't leave connections open after
 * errors", vendor/cpp-httplib/httplib.cpp Server::write_response_core; tools/server/server-http.cpp).
 */
export const jsonHeaders = (flavor: Flavor, status = 200): Record<string, string> => {
  if (flavor !== "llama_cpp") return {}
  const h: Record<string, string> = { "content-type": "application/json; charset=utf-8" }
  if (status >= 400) h.connection = "close"
  return h
}

/** An SSE answer's headers: llama-server's bare `text/event-stream` and X-Accel-Buffering (server-http.cpp). */
export const sseHeaders = (flavor: Flavor): Record<string, string> =>
  flavor === "llama_cpp"
    ? { "content-type": "text/event-stream", "x-accel-buffering": "no" }
    : { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" }

/** cpp-httplib's keep-alive, CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND and _MAX_COUNT (src/programs/sim.ts sets node's). */
export const LLAMA_KEEP_ALIVE_S = 5
export const LLAMA_MAX_REQUESTS = 100
const LLAMA_KEEP_ALIVE = `timeout=${LLAMA_KEEP_ALIVE_S}, max=${LLAMA_MAX_REQUESTS}`
/** The requests each connection has carried, counted here as node's maxRequestsPerSocket counts them. */
const requestsOn = new WeakMap<object, number>()

/**
 * What llama-server sends on every answer before a route's own headers: cpp-httplib's default `Server: llama.cpp`
 * (tools/server/server-http.cpp, set_default_headers) and the request's Origin echoed, empty without one (its
 * pre-routing handler, --cors-* defaults), plus `Accept-Ranges: bytes` on a HEAD answer (httplib
 * Server::write_response_core). httplib sends no Date, and on a kept connection `Keep-Alive` with no `Connection`
 * header, which node:http writes unless it is removed (then shouldKeepAlive alone keeps or closes the socket). Every
 * request counts toward a connection's last (the simulator's /sim/ ones too, as node counts them).
 */
export const llamaFraming = (req: http.IncomingMessage, res: http.ServerResponse): void => {
  res.sendDate = false
  res.setHeader("Server", "llama.cpp")
  res.setHeader("Access-Control-Allow-Origin", req.headers.origin ?? "")
  if (req.method === "HEAD") res.setHeader("Accept-Ranges", "bytes")
  const carried = (requestsOn.get(req.socket) ?? 0) + 1
  requestsOn.set(req.socket, carried)
  // httplib closes the connection after its last request (node would answer a 101st 503): `Connection: close`
  if (carried >= LLAMA_MAX_REQUESTS) res.shouldKeepAlive = false
  if (!res.shouldKeepAlive) return
  res.removeHeader("connection")
  res.setHeader("Keep-Alive", LLAMA_KEEP_ALIVE)
}

/** A JSON answer in the flavor's headers; a llama-server error closes the connection (jsonHeaders): no Keep-Alive. */
export const reply = (ctx: SimContext, res: http.ServerResponse, status: number, body: unknown): void => {
  if (ctx.cfg.flavor === "llama_cpp" && status >= 400) {
    res.removeHeader("Keep-Alive")
    res.shouldKeepAlive = false
  }
  sendJson(res, status, body, jsonHeaders(ctx.cfg.flavor, status))
}

/** An error body as the flavor's engine (of the simulated age: --sim-legacy-errors) sends it. */
export const errorReply = (ctx: SimContext, res: http.ServerResponse, status: number, body: unknown): void =>
  reply(ctx, res, status, ctx.cfg.flavor === "vllm" && ctx.cfg.legacyErrors ? legacyVllm(body) : body)

export const sendError = (
  ctx: SimContext,
  res: http.ServerResponse,
  status: number,
  message: string,
  param: string | null = null
) => errorReply(ctx, res, status, errorBody(ctx.cfg.flavor, status, message, param))
