// The kvcached link's reconnect backoff (src/layers/kv/kvcachedClient.ts runLink, through retrying.ts) against
// receivers on a temp Unix socket that answer Hello and then fail every Push: each session connects, so only
// progress (a Push acknowledged) may start the backoff over, else the link reconnects at the base delay forever.
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { MAX_ANSWER_LINE_CHARS, runLink } from "../../src/layers/kv/kvcachedClient.ts"
import { serve } from "../../src/layers/kv/kvcachedReceiver.ts"
import { type QueuedBody, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { type PushPayload, UnknownStream } from "../../src/services/kv/KvcachedRpc.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import { hello } from "../../src/services/kv/KvWire.ts"
import { jitteredBackoffMs } from "../../src/services/retry/Backoff.ts"
import { pollUntil } from "../support/poll.ts"

const CAP = 400
const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

/** The link against a receiver whose Push does `broken` while `failing`, and acknowledges everything otherwise. */
const setup = async (
  broken: (p: PushPayload) => Effect.Effect<never, UnknownStream>,
  callTimeoutMs?: number,
  helloAnswer: Effect.Effect<{ readonly applied: null }> = Effect.succeed({ applied: null })
) => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvbackoff-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  const sock = path.join(dir, "kvcached.sock")
  const ctl = { failing: true }
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const server = serve(sock, {
    Hello: () => helloAnswer,
    Push: (p) => (ctl.failing ? broken(p) : Effect.succeed({ applied: p.records.at(-1)?.n ?? null }))
  })
  await Effect.runPromise(Layer.buildWithScope(server, scope))

  const queue = new KvQueue<QueuedBody>(1 << 20)
  let ups = 0
  /** Each failed session (with its retry delay), and every report in order (a try under way has no delay). */
  const downs: Array<{ readonly error: string; readonly retryInMs: number }> = []
  const reports: Array<string> = []
  const fiber = Effect.runFork(
    runLink({
      path: sock,
      queue,
      hello: hello(
        { node_id: "n1", cluster: "c", model: "m", engine: "vllm" },
        { epoch: "e", blockSize: 4, dpSize: 1 }
      ),
      resync: resyncOf,
      materialize: (record) => ({ record, dropped: false }),
      backoffMaxMs: CAP,
      onConnected: (up, error, retryInMs) => {
        reports.push(up ? "up" : retryInMs === undefined ? `trying: ${error}` : `down: ${error}`)
        if (up) ups++
        else if (retryInMs !== undefined) downs.push({ error: error ?? "", retryInMs })
      },
      onForwarded: () => {},
      ...(callTimeoutMs === undefined ? {} : { callTimeoutMs })
    })
  )
  cleanups.push(() => Effect.runPromise(Fiber.interrupt(fiber)))
  let seq = 0n
  const send = () => queue.push(resyncOf({ reason: "gap", dpRank: 0, fromSeq: seq, toSeq: ++seq }))
  return { ctl, queue, downs, reports, ups: () => ups, send, sock }
}

/** "ok" for each delay within what `failures` in a row allow (50-100 % of 100 ms doubling, capped), else why not. */
const checkDelays = (delays: ReadonlyArray<number>, firstFailure = 1) =>
  delays.map((ms, i) => {
    const [lo, hi] = [jitteredBackoffMs(firstFailure + i, CAP, 0), jitteredBackoffMs(firstFailure + i, CAP, 1)]
    return ms >= lo && ms <= hi ? "ok" : `failure ${firstFailure + i}: ${ms} ms, not in ${lo}-${hi}`
  })

describe("the kvcached link's backoff", () => {
  it.each([
    ["fails every Push (UnknownStream)", (p: PushPayload) => Effect.fail(new UnknownStream(p))],
    ["dies in every Push (its journal cannot be written)", () => Effect.die(new Error("journal: ENOSPC"))]
  ])(
    "grows to its cap against a kvcached that answers Hello and %s, and starts over after a Push is acknowledged",
    async (_what, broken) => {
      const link = await setup(broken)
      link.send()
      await pollUntil("6 sessions ended", () => link.downs.length >= 6, 10_000, 10)
      // Every session got through Hello: connecting is not progress, and a link none of whose Pushes is
      // acknowledged is never reported connected.
      expect(
        link.reports.filter((r) => r === "trying: connected; Hello answered, no Push acknowledged yet").length
      ).toBeGreaterThanOrEqual(6)
      expect(link.ups()).toBe(0)
      expect(checkDelays(link.downs.slice(0, 6).map((d) => d.retryInMs))).toEqual(Array(6).fill("ok"))

      // kvcached works again: the resent record is acknowledged, and the next failure is the first in a row.
      link.ctl.failing = false
      await pollUntil("acknowledged", () => link.queue.size === 0 && link.queue.unacked.length === 0, 10_000, 10)
      expect(link.ups()).toBe(1)
      link.ctl.failing = true
      const before = link.downs.length
      link.send()
      await pollUntil("the next failure", () => link.downs.length > before, 10_000, 10)
      expect(checkDelays([link.downs[before]?.retryInMs ?? -1])).toEqual(["ok"])
    }
  )

  it("drops a session whose Push is never answered (kvcached stuck, its pings still answered) and resends the chunk", async () => {
    const link = await setup(() => Effect.never, 300)
    link.send()
    await pollUntil("the stuck Push given up", () => link.downs.length >= 1, 10_000, 10)
    expect(link.downs[0]?.error).toMatch(/kvcached did not answer Push within 300 ms/)
    // The unanswered chunk was kept: once kvcached answers, it is resent and acknowledged.
    link.ctl.failing = false
    await pollUntil("acknowledged", () => link.queue.size === 0 && link.queue.unacked.length === 0, 10_000, 10)
  })

  it("a kvcached stuck in Push longer than the backoff's cap is not shown connected, and is retried ever more slowly", async () => {
    // Each session lasts the Push timeout (500 ms), longer than the cap (400 ms): that alone is no progress.
    const link = await setup(() => Effect.never, 500)
    link.send()
    await pollUntil("4 stuck sessions given up", () => link.downs.length >= 4, 20_000, 10)
    expect(link.downs.map((d) => d.error)).toEqual(
      Array(link.downs.length).fill(expect.stringMatching(/did not answer Push/))
    )
    expect(checkDelays(link.downs.slice(0, 4).map((d) => d.retryInMs))).toEqual(Array(4).fill("ok"))
    expect(link.ups()).toBe(0)
  })

  it("a peer that sends a line longer than any answer (64 KiB) is dropped as it does, not buffered up to 16 MiB", async () => {
    const link = await setup(() => Effect.never)
    // Another process took the socket's place: it writes without end and never a line end.
    await Effect.runPromise(Effect.promise(() => fs.rm(link.sock)))
    const open = new Set<net.Socket>()
    const server = net.createServer((c) => {
      open.add(c)
      c.on("error", () => {})
      c.on("close", () => open.delete(c))
      c.write("x".repeat(MAX_ANSWER_LINE_CHARS + 1))
    })
    await new Promise<void>((resolve) => server.listen(link.sock, resolve))
    cleanups.push(
      () =>
        new Promise((resolve) => {
          server.close(resolve)
          for (const c of open) c.destroy()
        })
    )
    const line = await pollUntil(
      "a session dropped for the long line",
      () => link.downs.find((d) => /maximum size of 65536/.test(d.error)),
      10_000,
      10
    )
    expect(line.error).toMatch(/MaxBufferSizeExceeded/)
  })

  it("once a retry has connected, the status says Hello is unanswered, not the last failure's retry delay", async () => {
    const link = await setup(() => Effect.never, 300, Effect.never)
    await pollUntil("two sessions given up", () => link.downs.length >= 2, 10_000, 10)
    expect(link.downs[0]?.error).toMatch(/kvcached did not answer Hello within 300 ms/)
    // Each session, the first included, reports its connection before Hello fails: what the status showed
    // between a failure and the next one was the try under way, not "reconnecting in N ms" for 300 ms more.
    // The polling stopped at the second failure or soon after: the first four reports are the two sessions.
    expect(link.reports.slice(0, 4).map((r) => r.replace(/:.*/, ""))).toEqual(["trying", "down", "trying", "down"])
    expect(link.reports[0]).toBe("trying: connected; Hello not answered yet")
  })
})
