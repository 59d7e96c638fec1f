// Benchmark (not a test): streamed tokens/s of the engine simulator at N concurrent streams with zero
// latency knobs, measured by a loopback client in this process. The simulator is one Node process, so
// the figure is what one core sustains. Run: `npx node bench/sim.ts [--streams 256] [--seconds 10] [--max-tokens 512]`
import * as http from "node:http"
import { startSim } from "../test/support/sim.ts"

const arg = (name: string, d: number): number => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? Number(process.argv[i + 1]) : d
}
const streams = arg("--streams", 256)
const seconds = arg("--seconds", 10)
const maxTokens = arg("--max-tokens", 512)

const sim = await startSim({
  flavor: "vllm",
  args: ["serve", "bench/model", "--sim-mode", "random", "--sim-max-seqs", String(streams)]
})
const agent = new http.Agent({ keepAlive: true, maxSockets: streams })
const body = JSON.stringify({ model: "bench/model", prompt: "hello world", max_tokens: maxTokens, stream: true })
let tokens = 0
let requests = 0
let counting = false
let stop = false

// Each SSE event ends with "\n\n"; per stream the finish chunk and [DONE] are not tokens.
const one = (): Promise<void> =>
  new Promise((resolve, reject) => {
    const req = http.request(
      `${sim.url}/v1/completions`,
      {
        method: "POST",
        agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) }
      },
      (res) => {
        let tail = ""
        res.setEncoding("latin1")
        res.on("data", (chunk: string) => {
          const text = tail + chunk
          let i = text.indexOf("\n\n")
          let n = 0
          let last = -2
          while (i >= 0) {
            n++
            last = i
            i = text.indexOf("\n\n", i + 2)
          }
          tail = text.slice(last + 2)
          if (counting) tokens += n
        })
        res.on("end", () => {
          if (counting) tokens -= 2
          requests++
          resolve()
        })
        res.on("error", reject)
      }
    )
    req.on("error", reject)
    req.end(body)
  })

const worker = async () => {
  while (!stop) await one()
}
// The simulator runs in its own process group, so a failed request must still stop it (finally).
let elapsed: number
let cpu: NodeJS.CpuUsage
try {
  const workers = Array.from({ length: streams }, worker)
  await new Promise((r) => setTimeout(r, 1000)) // warm-up, not counted
  counting = true
  const t0 = performance.now()
  const cpu0 = process.cpuUsage()
  await new Promise((r) => setTimeout(r, seconds * 1000))
  elapsed = (performance.now() - t0) / 1000
  counting = false
  stop = true
  await Promise.all(workers)
  cpu = process.cpuUsage(cpu0)
} finally {
  stop = true
  await sim.stop()
  agent.destroy()
}
console.log(
  JSON.stringify({
    streams,
    seconds: Number(elapsed.toFixed(2)),
    maxTokens,
    tokens,
    tokensPerSecond: Math.round(tokens / elapsed),
    requests,
    clientCpuPercent: Math.round(((cpu.user + cpu.system) / 1e6 / elapsed) * 100)
  })
)
