// The engine's words in every error the agent passes on are scrubbed of the run's secrets (engine.api_key, the secrets
// of the engine's environment and arguments), where the EngineError is made (services/engine/EngineErrors.ts
// engineWords, with the one redactor the live EngineClient builds from its plan): an engine that answers 401 with
// "Incorrect API key provided: <key>" (OpenAI's words; a hostile or echoing server) showed the key to every caller,
// to /readyz, NodeHealth and the logs. Against a node:http server of this file's own, on each engine call the client
// makes: a stream's error status, error event and broken data, a whole answer's, /metrics; and the model list's read
// (ServedContext.ts), which brings only the key.
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Cause, Effect, Exit } from "effect"
import { getGlobalDispatcher } from "undici"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerFromPlan } from "../../src/layers/engine/EngineClient.ts"
import { getText, planRedactor } from "../../src/layers/engine/engineHttp.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { complete, EngineClient, type EngineError } from "../../src/services/engine/EngineClient.ts"
import { httpError } from "../../src/services/engine/EngineErrors.ts"
import { lineRedactor } from "../../src/services/engine/LineRedactor.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"

const KEY = "sk-SUPERSECRETKEY-1234567890"
const ENV_SECRET = "hf_envsecretvalue0123456789"
const ARG_SECRET = "argsecret-abcdef123456"
/** What must not be seen: each secret, and the first part of the key (a cut that falls inside it). */
const LEAKS = [KEY, ENV_SECRET, ARG_SECRET, KEY.slice(0, 8)]

const json = (res: http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}
const sse = (res: http.ServerResponse, text: string) => {
  res.writeHead(200, { "content-type": "text/event-stream" })
  res.end(text)
}
const chunk = `data: ${JSON.stringify({ id: "c", object: "text_completion", choices: [{ index: 0, text: "a" }] })}\n\n`
const said = `Incorrect API key provided: ${KEY}; HF_TOKEN=${ENV_SECRET} --hf-token ${ARG_SECRET}`

/** The answer for each case, by the request's X-Request-Id. */
const answers: Record<string, (res: http.ServerResponse) => void> = {
  status401: (res) =>
    json(res, 401, { error: { message: said, type: `invalid_request_error ${KEY}`, code: `invalid_api_key ${KEY}` } }),
  flat: (res) => json(res, 400, { object: "error", message: said, type: KEY, code: 400 }),
  midStream: (res) => sse(res, `${chunk}data: ${JSON.stringify({ error: { message: said, code: 500 } })}\n\n`),
  errorEvent: (res) => sse(res, `${chunk}event: error\ndata: ${said}\n\n`),
  notJson: (res) => sse(res, `data: {not json ${KEY}\n\n`),
  notSse: (res) => {
    res.writeHead(200, { "content-type": "text/html" })
    res.end(`<p>${said}</p>`)
  },
  // the cut at 500 characters falls inside the key: it is replaced whole, not shown up to the cut
  cutInside: (res) => {
    res.writeHead(500, { "content-type": "text/plain" })
    res.end(`${"x".repeat(490)}${KEY} and more`)
  },
  // as an engine prints it encoded
  encoded: (res) => {
    res.writeHead(500, { "content-type": "text/plain" })
    res.end(`Basic ${Buffer.from(`user:${KEY}`).toString("base64")} ${Buffer.from(KEY).toString("base64")}`)
  },
  wholeNotObject: (res) => json(res, 200, [said])
}

let server: http.Server
let base = ""

beforeAll(async () => {
  server = http.createServer((req, res) => {
    req.resume()
    req.on("end", () => {
      if (req.url === "/metrics") return json(res, 401, { error: { message: said } })
      if (req.url === "/v1/models") return json(res, 401, { detail: said })
      const answer = answers[String(req.headers["x-request-id"])]
      if (answer === undefined) return json(res, 404, { error: "no such case" })
      answer(res)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})

afterAll(async () => {
  server.closeAllConnections()
  await new Promise<void>((resolve) => server.close(() => resolve()))
})

/** A plan with engine.api_key, a secret in the engine's environment and one in its arguments. */
const plan = (): LaunchPlan =>
  testPlan({
    baseUrl: base,
    port: Number(new URL(base).port),
    argv: ["vllm", "serve", "org/m", "--hf-token", ARG_SECRET],
    env: { HF_TOKEN: ENV_SECRET },
    authorization: `Bearer ${KEY}`,
    metrics: { url: `${base}/metrics`, names: { running: ["r"], waiting: ["w"], kvUsage: [] } }
  })

const failure = async <A>(f: Effect.Effect<A, EngineError, EngineClient>): Promise<EngineError> => {
  const exit = await Effect.runPromise(Effect.exit(f).pipe(Effect.provide(layerFromPlan(plan()))))
  if (!Exit.isFailure(exit)) throw new Error("the call succeeded")
  return Cause.squash(exit.cause) as EngineError
}

const streamed = (requestId: string) =>
  failure(
    Effect.gen(function* () {
      const c = yield* EngineClient
      yield* c.streamTo("/v1/completions", { prompt: "p" }, { requestId }, { onChunks: () => true })
    })
  )
const whole = (requestId: string) =>
  failure(
    Effect.gen(function* () {
      return yield* complete(yield* EngineClient, "/v1/completions", {}, { requestId })
    })
  )

/** Every text of the error the agent passes on. */
const texts = (e: EngineError) => JSON.stringify([e.message, e.engineType, e.engineCode])

const expectScrubbed = (e: EngineError) => {
  for (const leak of LEAKS) expect(texts(e), `${e.reason}: ${texts(e)}`).not.toContain(leak)
  expect(texts(e)).toContain("<redacted>")
}

describe("the engine's words in an error, scrubbed of the run's secrets", () => {
  it.each([
    ["status401", "Http"],
    ["flat", "Http"],
    ["midStream", "Stream"],
    ["errorEvent", "Stream"],
    ["notJson", "Protocol"],
    ["notSse", "Protocol"],
    ["cutInside", "Http"],
    ["encoded", "Http"]
  ] as const)("a stream's %s (%s)", async (id, reason) => {
    const e = await streamed(id)
    expect(e.reason).toBe(reason)
    expectScrubbed(e)
  })

  it("the 401's words are kept but for the secrets", async () => {
    const e = await streamed("status401")
    expect([e.status, e.message, e.engineType, e.engineCode]).toEqual([
      401,
      "Incorrect API key provided: <redacted>; HF_TOKEN=<redacted> --hf-token <redacted>",
      "invalid_request_error <redacted>",
      "invalid_api_key <redacted>"
    ])
  })

  it.each(["status401", "cutInside", "wholeNotObject"])("a whole answer's %s (the test completion's way)", async (id) =>
    expectScrubbed(await whole(id))
  )

  it("/metrics (the load read)", async () => {
    expectScrubbed(
      await failure(
        Effect.gen(function* () {
          return yield* (yield* EngineClient).load
        })
      )
    )
  })

  it("the model list's read (ServedContext.ts), with the plan's redactor: the env's and argv's secrets too", async () => {
    const p = plan()
    const exit = await Effect.runPromise(
      Effect.exit(getText(getGlobalDispatcher(), `${base}/v1/models`, 5_000, p.authorization, planRedactor(p)))
    )
    if (!Exit.isFailure(exit)) throw new Error("the read succeeded")
    expectScrubbed(Cause.squash(exit.cause) as EngineError)
  })

  it("is scrubbed before the cut: a secret the cut falls inside is replaced whole", () => {
    const e = httpError(500, `${"x".repeat(495)}${KEY}`, lineRedactor([KEY]))
    expect(e.message).toBe(`${"x".repeat(495)}<redacted>…`)
  })
})
