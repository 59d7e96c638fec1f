// Prefill/decode hand-off between two simulators.
// vLLM (NIXL-like): the prefill engine holds a request's blocks under a lease and serves them on a side
// channel (HTTP on VLLM_NIXL_SIDE_CHANNEL_HOST:PORT); the decode engine REALLY pulls them by engine id,
// request id and block ids. SGLang: the prefill engine runs a bootstrap server; a decode engine connects there
// for its bootstrap_room and waits (long poll, bounded) for the prefill, which does not start before it.
import * as http from "node:http"
import { sendJson as json, readBody } from "./http.ts"

export interface Hold {
  readonly engineId: string
  readonly blockIds: ReadonlyArray<number>
  readonly numTokens: number
  readonly expiresAt: number
  readonly release: () => void
}

export type FetchResult =
  | { ok: true; numBlocks: number; numTokens: number }
  | { ok: false; status: number; reason: string }

const listen = (server: http.Server, port: number, host: string): Promise<void> =>
  new Promise((resolve, reject) => {
    server.once("error", reject)
    server.listen(port, host, () => {
      server.off("error", reject)
      resolve()
    })
  })

/**
 * The prefill side of the vLLM hand-off: held blocks by remote_request_id, expired by lease. Its reads are NIXL's:
 * the decode side reads blocks by id from the engine it shook hands with, and nothing on the prefill side checks
 * the request. The handshake fails on an engine id that is not this engine's ("Remote NIXL agent engine ID
 * mismatch", nixl_connector.py `_nixl_handshake`), and a block id outside the KV cache fails the transfer's setup
 * ("NIXL transfer setup/initiation failed", `_read_blocks`): the decode side's KV load fails. A request the
 * prefill side does not hold (unknown, read already, or expired) is read all the same; its notification only gets
 * logged ("Potentially invalid KV blocks for unrecognized request ...", `_get_new_notifs`), and the decode side
 * generates from whatever the blocks hold (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/
 * nixl_connector.py).
 */
export class SideChannel {
  private readonly holds = new Map<string, Hold & { timer: NodeJS.Timeout }>()
  private server: http.Server | undefined
  fetched = 0
  expired = 0
  /** Reads of a request this side did not hold. */
  unrecognized = 0

  private readonly engineId: string
  /** The KV cache's blocks: the ids a read can name. */
  private readonly numBlocks: number
  private readonly log: (msg: string, fields?: Record<string, unknown>) => void

  constructor(engineId: string, numBlocks: number, log: (msg: string, fields?: Record<string, unknown>) => void) {
    this.engineId = engineId
    this.numBlocks = numBlocks
    this.log = log
  }

  hold(requestId: string, hold: Omit<Hold, "expiresAt">, leaseMs: number): void {
    const timer = setTimeout(() => {
      this.holds.delete(requestId)
      this.expired++
      hold.release()
    }, leaseMs)
    timer.unref()
    this.holds.set(requestId, { ...hold, expiresAt: Date.now() + leaseMs, timer })
  }

  get held(): number {
    return this.holds.size
  }

  /** Serves POST /kv/fetch {engine_id, request_id, block_ids}. */
  async start(host: string, port: number): Promise<void> {
    this.server = http.createServer((req, res) => {
      if (req.method !== "POST" || req.url !== "/kv/fetch") return json(res, 404, { error: "not found" })
      readBody(req)
        .then((text) => {
          const body = JSON.parse(text) as { engine_id?: unknown; request_id?: unknown; block_ids?: unknown }
          const id = String(body.request_id)
          if (body.engine_id !== this.engineId)
            return json(res, 409, { error: `engine id mismatch (${String(body.engine_id)})` })
          const ids: Array<unknown> = Array.isArray(body.block_ids) ? body.block_ids.flat() : []
          if (ids.some((b) => !Number.isInteger(b) || (b as number) < 0 || (b as number) >= this.numBlocks))
            return json(res, 409, { error: "NIXL transfer setup failed: block ids outside the KV cache" })
          const h = this.holds.get(id)
          if (h === undefined) {
            this.unrecognized++
            this.log(
              `Potentially invalid KV blocks for unrecognized request ${id} were retrieved by a decode worker. They may have expired.`,
              { level: "error" }
            )
            return json(res, 200, { request_id: id, num_blocks: ids.length, num_tokens: 0 })
          }
          clearTimeout(h.timer)
          this.holds.delete(id)
          this.fetched++
          h.release()
          json(res, 200, { request_id: id, num_blocks: ids.length, num_tokens: h.numTokens })
        })
        .catch((err: unknown) => json(res, 400, { error: String(err) }))
    })
    await listen(this.server, port, host)
  }

  close(): void {
    this.server?.close()
    this.server?.closeAllConnections()
    for (const h of this.holds.values()) clearTimeout(h.timer)
  }
}

/** The decode side: pull a held request's blocks from the prefill engine's side channel. */
export const fetchBlocks = async (
  host: string,
  port: number,
  engineId: string,
  requestId: string,
  blockIds: unknown
): Promise<FetchResult> => {
  try {
    const res = await fetch(`http://${host.includes(":") ? `[${host}]` : host}:${port}/kv/fetch`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ engine_id: engineId, request_id: requestId, block_ids: blockIds }),
      signal: AbortSignal.timeout(5_000)
    })
    const body = (await res.json()) as { error?: string; num_blocks?: number; num_tokens?: number }
    if (!res.ok) return { ok: false, status: res.status, reason: body.error ?? `status ${res.status}` }
    return { ok: true, numBlocks: body.num_blocks ?? 0, numTokens: body.num_tokens ?? 0 }
  } catch (err) {
    return { ok: false, status: 0, reason: `side channel unreachable: ${String(err)}` }
  }
}

/** Rooms that reached a state, with the waiters for each room; bounded, the oldest forgotten first. */
class Rooms {
  private readonly reached = new Map<string, number>()
  private readonly waiters = new Map<string, Set<() => void>>()

  has(room: string): boolean {
    return this.reached.has(room)
  }

  mark(room: string): void {
    this.reached.set(room, Date.now())
    if (this.reached.size > 10_000) {
      const first = this.reached.keys().next().value
      if (first !== undefined) this.reached.delete(first)
    }
    for (const w of this.waiters.get(room) ?? []) w()
    this.waiters.delete(room)
  }

  /** Forgets the room; whether it had been reached. */
  take(room: string): boolean {
    return this.reached.delete(room)
  }

  /** Resolves true once the room is marked, false after `timeoutMs` or on abort. */
  wait(room: string, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
    if (this.reached.has(room)) return Promise.resolve(true)
    return new Promise((resolve) => {
      const set = this.waiters.get(room) ?? new Set()
      this.waiters.set(room, set)
      const finish = (ok: boolean) => {
        clearTimeout(timer)
        set.delete(waiter)
        if (set.size === 0 && this.waiters.get(room) === set) this.waiters.delete(room)
        signal?.removeEventListener("abort", aborted)
        resolve(ok)
      }
      const waiter = () => finish(true)
      const aborted = () => finish(false)
      const timer = setTimeout(() => finish(false), Math.max(0, timeoutMs))
      set.add(waiter)
      signal?.addEventListener("abort", aborted, { once: true })
    })
  }
}

/**
 * SGLang's bootstrap server on the prefill engine. The order is SGLang's: a prefill request stays in the
 * bootstrap queue until the decode side has connected for its room (PrefillBootstrapQueue.pop_bootstrapped
 * skips senders still in KVPoll.Bootstrapping, python/sglang/srt/disaggregation/prefill.py), and only then is
 * prefilled and its KV sent; the decode request waits for that transfer. A prefill leg sent alone never
 * finishes; it fails at the bootstrap timeout.
 */
export class Bootstrap {
  /** Rooms a decode engine has connected for (its handshake with this prefill server). */
  private readonly connected = new Rooms()
  /** Rooms whose prefill is done and whose KV has been sent. */
  private readonly done = new Rooms()
  private server: http.Server | undefined

  complete(room: string): void {
    this.done.mark(room)
  }

  /** Prefill side: wait (bounded) until a decode engine has connected for the room. */
  waitForDecode(room: string, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
    return this.connected.wait(room, timeoutMs, signal)
  }

  /**
   * GET /room/<room>?wait_ms=N: connects the decode side for the room, then 200 once its prefill is done (the room
   * is then forgotten), 408 after the wait.
   */
  async start(host: string, port: number): Promise<void> {
    this.server = http.createServer((req, res) => {
      const url = new URL(req.url ?? "/", "http://x")
      const m = /^\/room\/(\d+)$/.exec(url.pathname)
      if (m === null) return json(res, 404, { error: "not found" })
      const room = m[1] ?? ""
      if (!this.connected.has(room)) this.connected.mark(room)
      const waitMs = Math.min(Number(url.searchParams.get("wait_ms") ?? "0"), 60_000)
      const gone = new AbortController()
      res.on("close", () => gone.abort())
      void this.done.wait(room, waitMs, gone.signal).then((ok) => {
        if (res.writableEnded || gone.signal.aborted) return
        // A room's KV is sent once: the prefill side forgets the room after its last chunk
        // (`self.transfer_infos.pop(room)` in the transfer worker, python/sglang/srt/disaggregation/mooncake/conn.py),
        // so a later decode leg for it (a retry, a second decode) waits for a transfer that never comes and fails
        // at its waiting timeout, as one whose prefill never came.
        const served = ok && this.done.take(room)
        if (served) this.connected.take(room)
        json(res, served ? 200 : 408, { room, status: served ? "ready" : "waiting" })
      })
    })
    await listen(this.server, port, host)
  }

  close(): void {
    this.server?.close()
    this.server?.closeAllConnections()
  }
}

/**
 * How SGLang's decode side gives up on a prefill it cannot reach (python/sglang/srt/disaggregation/decode.py,
 * common/conn.py): a bootstrap server never reached fails the request once fetching the prefill's parallel info
 * has failed 15 times, 1 s apart ("Could not fetch prefill parallel info ..."); one reached before and lost since
 * (the prefill died mid-handoff) once its heartbeat (GET /health every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL,
 * 5 s, at least 2) failed SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE (2, at least 1) times in a row ("Losing
 * connection with prefill instance"). Either way within seconds, not at the 300 s waiting timeout.
 */
export interface PrefillLoss {
  readonly infoTries: number
  readonly heartbeatIntervalMs: number
  readonly heartbeatMaxFailures: number
}

export const prefillLossOf = (env: NodeJS.ProcessEnv): PrefillLoss => {
  const interval = Number(env.SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL ?? "5")
  const failures = Number(env.SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE ?? "2")
  return {
    infoTries: 15,
    heartbeatIntervalMs: Math.max(Number.isFinite(interval) ? interval : 5, 2) * 1000,
    heartbeatMaxFailures: Math.max(Number.isInteger(failures) ? failures : 2, 1)
  }
}

const INFO_RETRY_MS = 1_000

/**
 * Decode side: wait up to `timeoutMs` for the room's prefill on bootstrap_host:bootstrap_port, giving up on a
 * prefill that cannot be reached as `loss` says. Each wait is cut at the heartbeat interval, so a bootstrap server
 * that answers (408: not done yet) is known to be there.
 */
export const waitForRoom = async (
  host: string,
  port: number,
  room: string,
  timeoutMs: number,
  signal: AbortSignal,
  loss: PrefillLoss
): Promise<{ ok: true } | { ok: false; reason: string }> => {
  const deadline = Date.now() + timeoutMs
  const addr = `${host}:${port}`
  let last = "timed out"
  let reached = false
  let failures = 0
  while (Date.now() < deadline && !signal.aborted) {
    const left = deadline - Date.now()
    const waitMs = Math.max(1, Math.min(left, loss.heartbeatIntervalMs))
    try {
      const res = await fetch(`http://${addr}/room/${room}?wait_ms=${waitMs}`, {
        signal: AbortSignal.any([signal, AbortSignal.timeout(waitMs + 2_000)])
      })
      await res.arrayBuffer()
      if (res.status === 200) return { ok: true }
      reached = true
      failures = 0
      last = `bootstrap server answered ${res.status}`
    } catch (err) {
      if (signal.aborted) break
      failures += 1
      if (!reached && failures >= loss.infoTries) {
        return {
          ok: false,
          reason: `Could not fetch prefill parallel info from bootstrap_addr: ${addr} (${String(err)})`
        }
      }
      if (reached && failures >= loss.heartbeatMaxFailures) {
        return {
          ok: false,
          reason: `Losing connection with prefill instance (bootstrap_addr: ${addr}), affected 1 requests`
        }
      }
      const pause = reached ? loss.heartbeatIntervalMs : INFO_RETRY_MS
      await new Promise((r) => setTimeout(r, Math.min(pause, Math.max(1, deadline - Date.now()))))
    }
  }
  return { ok: false, reason: signal.aborted ? "aborted" : last }
}
