// RSS of the KV bridge while cgn-kvcached is away (issue: the queue held memory it no longer needed).
//   node --expose-gc bench/kv-rss.ts [--seconds 60] [--rate 200] [--blocks 256] [--max-queue-bytes N]
//        [--bridge path/to/layers/KvBridge.ts [--ndjson-sink]]   (another checkout's bridge, e.g. the old one)
// A child process publishes vLLM-shaped KV-event batches (`--blocks` BlockStored blocks of 16 tokens each,
// `--rate` batches/s) on ZMQ; this process runs the bridge with kvcached absent for `--seconds`, printing RSS
// every 5 s, then starts the reference receiver, waits until the queue is drained, and prints RSS after a GC
// (run with --expose-gc for that). A measurement, not a test: the figures go to the report.
import { spawn } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Context, Effect, Layer } from "effect"

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? (process.argv[i + 1] as string) : dflt
}
const seconds = Number(arg("--seconds", "60"))
const rate = Number(arg("--rate", "200"))
const blocks = Number(arg("--blocks", "256"))
const bridgePath = path.resolve(arg("--bridge", new URL("../src/layers/kv/KvBridge.ts", import.meta.url).pathname))
const root = path.resolve(path.dirname(bridgePath), "../../..")

// Typed as this checkout's modules; `--bridge` may load another checkout's (same shape where it matters).
const KvBridgeLive: typeof import("../src/layers/kv/KvBridge.ts") = await import(bridgePath)
// A bare registry: src/testing/Metrics.ts (an older checkout: the live module's layerTest).
const testMetrics = path.join(root, "src/testing/Metrics.ts")
const MetricsTest: typeof import("../src/testing/Metrics.ts") = await import(
  fs.existsSync(testMetrics) ? testMetrics : path.join(root, "src/layers/observability/Metrics.ts")
)
const { KvBridge }: typeof import("../src/services/kv/KvBridge.ts") = await import(
  path.join(root, "src/services/kv/KvBridge.ts")
)

const toMB = (b: number) => Math.round(b / 1024 / 1024)
const mb = () => toMB(process.memoryUsage().rss)
const heap = () => {
  const m = process.memoryUsage()
  return { heapUsedMB: toMB(m.heapUsed), heapTotalMB: toMB(m.heapTotal), externalMB: toMB(m.external) }
}
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kv-rss-"))
const uds = path.join(dir, "kvcached.sock")
const port = 20_000 + Math.floor(Math.random() * 20_000)

const publisher = `
const zmq = require("zeromq"); const { encode } = require("@msgpack/msgpack")
const pub = new zmq.Publisher({ linger: 0, sendHighWaterMark: 1e6 })
let seq = 0n, h = 1n << 63n
const frame = (s) => { const b = Buffer.alloc(8); b.writeBigUInt64BE(s); return b }
const batch = () => encode([Date.now() / 1000, Array.from({ length: ${blocks} }, () => ({ type: "BlockStored",
  block_hashes: [h++], parent_block_hash: h - 2n, token_ids: Array.from({ length: 16 }, (_, i) => i * 7919),
  block_size: 16, medium: "GPU" })), 0], { useBigInt64: true })
pub.bind("tcp://127.0.0.1:${port}").then(async () => {
  for (;;) { const t = Date.now(); await pub.send(["kv-events", frame(seq++), batch()])
    await new Promise((r) => setTimeout(r, Math.max(0, 1000 / ${rate} - (Date.now() - t)))) }
})`
const child = spawn(process.execPath, ["-e", publisher], { cwd: root, stdio: "inherit" })

const options = {
  kvEvents: { endpoint: `tcp://127.0.0.1:${port}`, engineBinds: true, replayEndpoint: undefined, topic: "kv-events" },
  uds,
  identity: { node_id: "n1", cluster: "c", model: "m", engine: "vllm" },
  blockSize: 16,
  epoch: "bench",
  backoffMaxMs: 1_000,
  ...(process.argv.includes("--max-queue-bytes") ? { maxQueueBytes: Number(arg("--max-queue-bytes", "0")) } : {})
}
const layer = KvBridgeLive.layerWith(options).pipe(Layer.provideMerge(MetricsTest.layerTest))

await Effect.runPromise(
  Effect.scoped(
    Effect.gen(function* () {
      const ctx = yield* Layer.build(layer)
      const status = Context.get(ctx, KvBridge).status
      const show = (label: string) =>
        Effect.map(status, (s) =>
          console.log(
            JSON.stringify({
              label,
              rssMB: mb(),
              ...heap(),
              queued: s.queued,
              queuedBytes: s.queuedBytes,
              dropped: s.dropped
            })
          )
        )
      // The old NDJSON wire (before the RPC contract) only needs a reader that discards.
      const sink = process.argv.includes("--ndjson-sink")
        ? ["-e", `require("node:net").createServer((c) => c.resume()).listen(${JSON.stringify(uds)})`]
        : [path.join(root, "src/programs/kvcachedReceiver.ts"), "--uds", uds]
      // --present: the baseline, kvcached there all along.
      const present = process.argv.includes("--present")
      let receiver = present ? spawn(process.execPath, sink, { stdio: "ignore" }) : undefined
      yield* show("start")
      for (let t = 5; t <= seconds; t += 5) {
        yield* Effect.sleep(5_000)
        yield* show(`kvcached ${present ? "present" : "absent"} ${t}s`)
      }
      child.kill("SIGKILL")
      receiver ??= spawn(process.execPath, sink, { stdio: "ignore" })
      const t0 = Date.now()
      while ((yield* status).queued > 0 && Date.now() - t0 < 120_000) yield* Effect.sleep(500)
      yield* show("drained")
      ;(globalThis as { gc?: () => void }).gc?.()
      yield* Effect.sleep(2_000)
      ;(globalThis as { gc?: () => void }).gc?.()
      yield* show("drained, after GC")
      receiver.kill("SIGKILL")
    })
  )
)
fs.rmSync(dir, { recursive: true, force: true })
process.exit(0)
