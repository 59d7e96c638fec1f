// The KV bridge's link to cgn-kvcached through real processes: the engine simulator publishes KV events
// while completions run, the bridge forwards them over effect RPC, and the reference receiver
// (src/programs/kvcachedReceiver.ts, journaled) is stopped, SIGKILLed mid-stream and restarted. The
// journal is the receiver's applied state: every batch must be in it exactly once, or a Resync in it must
// name exactly the seqs that are missing. How the journal is read back (a torn line, a reconnect, epochs) directly.
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import * as KvBridgeLive from "../../src/layers/kv/KvBridge.ts"
import { type JournalEntry, readJournal, restoreFrom } from "../../src/layers/kv/kvcachedReceiver.ts"
import { KvBridge, type KvBridgeStatus } from "../../src/services/kv/KvBridge.ts"
import type { KvRecord } from "../../src/services/kv/KvcachedRpc.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { receiverEntry } from "../support/kvcached.ts"
import { followLines } from "../support/lines.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { postJson, type SimHandle, startSim } from "../support/sim.ts"

const id = { node_id: "n1", cluster: "c1", model: "m", engine: "vllm" }

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

const until = <T>(f: () => T | undefined | false | Promise<T | undefined | false>, what: string, ms = 20_000) =>
  pollUntil(what, f, ms, 20)

/** The reference receiver as a process; `kill` SIGKILLs it (after a SIGSTOP, if `stop` was called). */
const startReceiver = async (uds: string, journal: string) => {
  const proc: ChildProcess = spawn(process.execPath, [receiverEntry, "--uds", uds, "--journal", journal], {
    stdio: ["ignore", "ignore", "pipe"]
  })
  const exited = new Promise<void>((r) => proc.once("exit", () => r()))
  const kill = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL")
    await exited
  }
  cleanups.push(kill)
  await followLines(proc.stderr).waitFor((l) => l.includes('"msg":"listening"'), 60_000, "receiver listening")
  return { kill, stop: () => proc.kill("SIGSTOP") }
}

const records = (journal: string): Array<KvRecord> =>
  readJournal(journal).flatMap((e: JournalEntry) => ("record" in e && e.epoch === "e1" ? [e.record] : []))

/**
 * Walks the applied records in order: link seqs 0..N-1 once each; per batch, the seq that follows the last
 * one, unless a Resync just before says from exactly where to where the stream skipped.
 */
const audit = (recs: ReadonlyArray<KvRecord>) => {
  expect(recs.map((r) => r.n)).toEqual(recs.map((_, i) => i))
  const seen = new Set<number>()
  const lost: Array<{ reason: string; from: number; to: number }> = []
  let expected: number | undefined
  for (const r of recs) {
    if (r.type === "Resync") {
      if (expected !== undefined) expect(r.from_seq).toBe(expected)
      lost.push({ reason: r.reason, from: r.from_seq, to: r.to_seq })
      expected = r.to_seq
      continue
    }
    if (expected !== undefined) expect(r.seq).toBe(expected)
    expect(seen.has(r.seq)).toBe(false)
    seen.add(r.seq)
    expected = r.seq + 1
  }
  const first = recs[0]
  // Where the stream starts: its first batch, or what a leading Resync says was lost before it.
  const start = first === undefined ? 0 : first.type === "Batch" ? first.seq : first.from_seq
  return { batches: seen.size, start, last: recs.findLast((r) => r.type === "Batch")?.seq ?? -1, lost }
}

const setup = async (maxQueueBytes?: number) => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvlink-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  const uds = path.join(dir, "kvcached.sock")
  const journal = path.join(dir, "journal.ndjson")
  const port = await freePort()
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const layer = KvBridgeLive.layerWith({
    kvEvents: {
      endpoint: `tcp://127.0.0.1:${port}`,
      engineBinds: false,
      replayEndpoint: undefined,
      topic: "kv-events"
    },
    uds,
    identity: id,
    blockSize: 4,
    epoch: "e1",
    backoffMaxMs: 200,
    ...(maxQueueBytes !== undefined ? { maxQueueBytes } : {})
  }).pipe(Layer.provideMerge(MetricsTest.layerTest))
  const ctx = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  const status = () => Effect.runPromise(Context.get(ctx, KvBridge).status)
  const metrics = () => Effect.runPromise(Context.get(ctx, Metrics).render).then((t) => t.body)
  const cfg = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: `tcp://127.0.0.1:${port}`,
    topic: "kv-events"
  }
  const sim = await startSim({
    args: ["serve", "m", "--kv-events-config", JSON.stringify(cfg), "--sim-block-size", "4"]
  })
  cleanups.push(() => sim.stop())
  return { uds, journal, status, metrics, pump: pump(sim) }
}

/** Completions in a loop (each publishes KV-event batches) until `stop`; `start` runs it again. */
const pump = (sim: SimHandle) => {
  let running = false
  let n = 0
  let loop: Promise<void> = Promise.resolve()
  const start = () => {
    if (running) return
    running = true
    loop = (async () => {
      while (running) {
        const w = (i: number) => `w${n}x${i}`
        await postJson(`${sim.url}/v1/completions`, {
          prompt: Array.from({ length: 9 }, (_, i) => w(i)).join(" "),
          max_tokens: 1
        }).catch(() => undefined)
        n++
      }
    })()
  }
  const stop = async () => {
    running = false
    await loop
  }
  start()
  cleanups.push(stop)
  return { start, stop }
}

const seqOf = (s: KvBridgeStatus) => Number(s.ranks[0]?.lastSeq ?? -1)
const batchesIn = (journal: string) => records(journal).filter((r) => r.type === "Batch").length

/** After the pump stopped: everything the bridge saw is applied and acknowledged. */
const drained = async (link: Awaited<ReturnType<typeof setup>>) => {
  await until(async () => {
    const s = await link.status()
    const last = records(link.journal).findLast((r) => r.type === "Batch")
    return s.queued === 0 && last?.type === "Batch" && last.seq === seqOf(s) ? s : undefined
  }, "every batch applied and acknowledged")
  return link.status()
}

describe("the kvcached link through a receiver that is killed and restarted", () => {
  it("every batch arrives exactly once, also those in flight when the receiver died", async () => {
    const link = await setup()
    let receiver = await startReceiver(link.uds, link.journal)
    for (let round = 1; round <= 3; round++) {
      await until(() => batchesIn(link.journal) >= round * 20 || undefined, `20 more batches (round ${round})`)
      // Frozen, it reads nothing: the Push now in flight is certainly not applied when it dies.
      receiver.stop()
      const frozenAt = seqOf(await link.status())
      await until(async () => {
        const s = await link.status()
        return (s.queued > 0 && seqOf(s) >= frozenAt + 10) || undefined
      }, "batches sent but not acknowledged")
      await receiver.kill()
      await until(async () => (await link.status()).kvcachedConnected === false || undefined, "link down")
      receiver = await startReceiver(link.uds, link.journal)
    }
    await link.pump.stop()
    const st = await drained(link)
    const a = audit(records(link.journal))
    expect(a.lost).toEqual([])
    expect(a.batches).toBe(a.last - a.start + 1)
    expect(a.batches).toBeGreaterThanOrEqual(60)
    expect(st).toMatchObject({ forwarded: a.batches, dropped: 0, resyncs: 0, kvcachedConnected: true })
    // Connected again: the failures of the killed receivers are not shown as current.
    expect(st.lastError).toBeUndefined()
  }, 120_000)

  it("a receiver back without its state (an empty journal) is counted and said: what it had acknowledged is not resent", async () => {
    const link = await setup()
    const first = await startReceiver(link.uds, link.journal)
    // Acknowledged, not only journaled: a receiver killed between its journal and its answer acknowledged nothing,
    // and the link then sends it all again, rightly without a word.
    await until(async () => ((await link.status()).forwarded >= 10 ? true : undefined), "10 batches acknowledged")
    await first.kill()
    await until(async () => (await link.status()).kvcachedConnected === false || undefined, "link down")
    const empty = `${link.journal}.2`
    await startReceiver(link.uds, empty)
    await until(() => batchesIn(empty) >= 5 || undefined, "5 batches applied by the new receiver")
    await link.pump.stop()
    const st = await link.status()
    expect(st.kvcachedStateLosses).toBe(1)
    // ... and the operator's series says it (no Resync here: it is not the resync counter's)
    expect(st.resyncs).toBe(0)
    expect(await link.metrics()).toMatch(/^cgn_agent_kvcached_state_losses_total 1$/m)
    // The new receiver starts where the link was: nothing it had lost comes again.
    const firstSeq = readJournal(empty).flatMap((e: JournalEntry) => ("record" in e ? [e.record] : []))[0]
    expect(firstSeq?.n).toBeGreaterThan(0)
  }, 60_000)

  it("a receiver back with part of its state (its journal's tail lost): a gap Resync per rank, then on without a hole in n", async () => {
    const link = await setup()
    const first = await startReceiver(link.uds, link.journal)
    await until(async () => ((await link.status()).forwarded >= 20 ? true : undefined), "20 batches acknowledged")
    // no new events, and all sent ones applied and acknowledged before the receiver dies: a cut of its journal's tail
    // is then sure to lose acknowledged records (with the pump on, a slow machine's link held more than the whole
    // journal, unsent, and the cut could not be made)
    await link.pump.stop()
    await drained(link)
    await first.kill()
    await until(async () => (await link.status()).kvcachedConnected === false || undefined, "link down")
    // the receiver comes back from a journal that lost its last records, acknowledged ones among them: more than the
    // link holds unacknowledged (at most what it holds at all, `queued`, now that no answer can come)
    const held = (await link.status()).queued
    const lines = (await fs.readFile(link.journal, "utf8")).split("\n").filter((l) => l !== "")
    const recordLines = lines.flatMap((l, i) => ("record" in JSON.parse(l) ? [i] : []))
    expect(recordLines.length).toBeGreaterThan(held + 5)
    const cut = recordLines.at(-(held + 5)) ?? 0
    await fs.writeFile(link.journal, `${lines.slice(0, cut).join("\n")}\n`)
    const kept = records(link.journal)
    const applied = kept.at(-1)?.n ?? -1
    await startReceiver(link.uds, link.journal)
    link.pump.start()
    await until(() => records(link.journal).length >= kept.length + 10 || undefined, "records after the restart")
    await link.pump.stop()
    const st = await drained(link)
    expect(st.kvcachedStateLosses).toBe(1)
    const recs = records(link.journal)
    // n goes on from what the receiver applied, with no hole; a gap Resync from seq 0 comes first
    expect(recs.map((r) => r.n)).toEqual(recs.map((_, i) => i))
    const resync = recs[applied + 1]
    expect(resync).toMatchObject({ type: "Resync", reason: "gap", dp_rank: 0, from_seq: 0 })
    // ... to the seq the stream goes on with: the next record's
    const next = recs[applied + 2]
    expect(resync?.type === "Resync" && resync.to_seq).toBe(next?.type === "Batch" ? next.seq : next?.from_seq)
  }, 60_000)

  it("past the byte bound while the receiver is away, an overflow Resync names exactly what is missing", async () => {
    const link = await setup(16 * 1024)
    let receiver = await startReceiver(link.uds, link.journal)
    await until(() => batchesIn(link.journal) >= 10 || undefined, "10 batches")
    receiver.stop()
    await until(async () => (await link.status()).dropped > 0 || undefined, "overflow")
    await receiver.kill()
    receiver = await startReceiver(link.uds, link.journal)
    await until(() => batchesIn(link.journal) >= 40 || undefined, "batches after the restart")
    await link.pump.stop()
    const st = await drained(link)
    const a = audit(records(link.journal))
    expect(a.lost.length).toBeGreaterThan(0)
    expect(a.lost.every((l) => l.reason === "overflow")).toBe(true)
    const missing = a.lost.reduce((sum, l) => sum + (l.to - l.from), 0)
    expect(a.batches + missing).toBe(a.last - a.start + 1)
    expect(st).toMatchObject({ forwarded: a.batches, dropped: missing, resyncs: a.lost.length })
    expect(st.queuedBytes).toBe(0)
  }, 120_000)
})

describe("the reference receiver's journal, read back at its start", () => {
  const hello = (node_id: string, epoch: string): JournalEntry => ({
    hello: { version: 2, node_id, cluster: "c1", model: "m", engine: "vllm", block_size: 4, dp_size: 1, epoch }
  })
  const applied = (node_id: string, epoch: string, n: number): JournalEntry => ({
    node_id,
    epoch,
    record: { type: "Batch", n, dp_rank: 0, seq: n, ts: 1, events: [] }
  })

  it("a torn last line (the receiver killed mid-write) is ignored: it was never acknowledged", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvjournal-"))
    cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
    const journal = path.join(dir, "journal.ndjson")
    const whole = [hello("n1", "e1"), applied("n1", "e1", 0)]
    const torn = JSON.stringify(applied("n1", "e1", 1)).slice(0, 20)
    await fs.writeFile(journal, `${whole.map((e) => JSON.stringify(e)).join("\n")}\n${torn}`)
    expect(readJournal(journal)).toEqual(whole)
    expect(restoreFrom(readJournal(journal))).toEqual([{ node_id: "n1", epoch: "e1", applied: 0 }])
  })

  it("a reconnect's Hello (same epoch) keeps what was applied; a new epoch starts over and counts only its own", () => {
    // killed right after a reconnect's Hello: what the epoch applied before it still stands
    expect(restoreFrom([hello("n1", "e1"), applied("n1", "e1", 0), applied("n1", "e1", 1), hello("n1", "e1")])).toEqual(
      [{ node_id: "n1", epoch: "e1", applied: 1 }]
    )
    // a record of another epoch than the node's last Hello is not what that epoch applied; other nodes are their own
    expect(
      restoreFrom([
        hello("n1", "e1"),
        applied("n1", "e1", 4),
        hello("n2", "e7"),
        hello("n1", "e2"),
        applied("n1", "e1", 5),
        applied("n2", "e7", 0)
      ])
    ).toEqual([
      { node_id: "n1", epoch: "e2", applied: null },
      { node_id: "n2", epoch: "e7", applied: 0 }
    ])
  })
})

describe("cgn-agent/kvcached", () => {
  it("the package export (built to dist) carries the contract and the reference receiver", async () => {
    // resolved at run time through package.json "exports" (dist/, built by `npm test` before vitest); typed
    // from the source, so the typecheck that runs before the build does not need dist/
    const specifier: string = "cgn-agent/kvcached"
    const m = (await import(specifier)) as typeof import("../../src/kvcached.ts")
    expect(m.KV_WIRE_VERSION).toBe(2)
    expect([...m.KvcachedRpcs.requests.keys()].sort()).toEqual(["Hello", "Push"])
    expect(typeof m.ReceiverState).toBe("function")
    expect(typeof m.layer).toBe("function")
  })
})
