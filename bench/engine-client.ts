// Micro benchmark (not a test): CPU of the EngineClient alone per streamed token, against the simulator
// (a separate process, so its CPU is not counted). For reference the same load through bare undici that only
// counts `\n\n` (no SSE parsing, no JSON, no Effect) gives the floor of the HTTP stack itself.
// Run: `npx node bench/engine-client.ts [--streams 1,64,256] [--seconds 5] [--max-tokens 256]`
import { Effect, ManagedRuntime, Stream } from "effect"
import { Agent } from "undici"
import { decodeConfigObject } from "../src/layers/config/Config.ts"
import { engineFor } from "../src/layers/engine/backends/index.ts"
import { layerFromPlan } from "../src/layers/engine/EngineClient.ts"
import { EngineClient } from "../src/services/engine/EngineClient.ts"
import { streamOf } from "../src/testing/EngineClient.ts"
import { freePort } from "../test/support/ports.ts"
import { startSim } from "../test/support/sim.ts"

const arg = (name: string, d: string): string => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? (process.argv[i + 1] ?? d) : d
}
const streamCounts = arg("--streams", "1,64,256").split(",").map(Number)
const seconds = Number(arg("--seconds", "5"))
const maxTokens = Number(arg("--max-tokens", "256"))

const port = await freePort()
const decoded = decodeConfigObject(
  { engine: { kind: "vllm", url: `http://127.0.0.1:${port}` }, models: { m: { hf_repo: "bench/model" } } },
  undefined
)
if (decoded._tag === "Failure") throw new Error(decoded.failure.message)
const plan = engineFor("vllm").render(decoded.success)
const maxStreams = Math.max(...streamCounts)
const sim = await startSim({
  flavor: "vllm",
  args: [...plan.argv.slice(1), "--sim-mode", "random", "--sim-max-seqs", String(maxStreams)]
})
const body = { model: "m", prompt: "hello world", max_tokens: maxTokens }

interface Sample {
  readonly tokens: number
  readonly cpuUs: number
  readonly wallS: number
}

/** Runs `streams` request loops; counts only tokens seen inside the measuring window. */
const measure = async (streams: number, loop: (count: () => boolean) => Promise<void>): Promise<Sample> => {
  let tokens = 0
  let measuring = false
  let stop = false
  const count = (): boolean => {
    if (measuring) tokens++
    return stop
  }
  const loops = Array.from({ length: streams }, () => loop(count))
  await new Promise((r) => setTimeout(r, 1000)) // warm-up: JIT, connections
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  measuring = true
  await new Promise((r) => setTimeout(r, seconds * 1000))
  measuring = false
  const cpu = process.cpuUsage(cpu0)
  const wallS = (performance.now() - t0) / 1000
  stop = true
  await Promise.all(loops)
  return { tokens, cpuUs: cpu.user + cpu.system, wallS }
}

// One client (one pool) shared by all loops, as in the agent.
const runtime = ManagedRuntime.make(layerFromPlan(plan))
const clientLoop = (count: () => boolean): Promise<void> =>
  runtime.runPromise(
    Effect.gen(function* () {
      const client = yield* EngineClient
      let stopped = false
      while (!stopped) {
        yield* Stream.runForEach(streamOf(client)("/v1/completions", body), (chunk) =>
          Effect.sync(() => {
            if (Array.isArray(chunk.choices) && chunk.choices.length > 0 && count()) stopped = true
          })
        )
      }
    })
  )

const bare = new Agent({ connections: null, pipelining: 1 })
const bareBody = JSON.stringify({ ...body, model: plan.requestModel, stream: true })
const bareLoop = async (count: () => boolean): Promise<void> => {
  let stopped = false
  while (!stopped) {
    await new Promise<void>((resolve, reject) => {
      bare.dispatch(
        {
          origin: plan.baseUrl,
          path: "/v1/completions",
          method: "POST",
          headers: { "content-type": "application/json" },
          body: bareBody
        },
        {
          onRequestStart() {},
          onResponseStart() {},
          onResponseData(_c, chunk) {
            let i = chunk.indexOf("\n\n")
            while (i >= 0) {
              if (count()) stopped = true
              i = chunk.indexOf("\n\n", i + 2)
            }
          },
          onResponseEnd() {
            resolve()
          },
          onResponseError(_c, e) {
            reject(e)
          }
        }
      )
    })
  }
}

const rows: Array<string> = []
try {
  for (const streams of streamCounts) {
    for (const [name, loop] of [
      ["EngineClient", clientLoop],
      ["bare undici", bareLoop]
    ] as const) {
      const s = await measure(streams, loop)
      rows.push(
        `${name.padEnd(12)} streams=${String(streams).padStart(3)}  tokens/s=${Math.round(s.tokens / s.wallS)
          .toString()
          .padStart(7)}  cpu µs/token=${(s.cpuUs / Math.max(1, s.tokens)).toFixed(2)}`
      )
      console.log(rows[rows.length - 1])
    }
  }
} finally {
  await runtime.dispose()
  await bare.destroy()
  await sim.stop()
}
