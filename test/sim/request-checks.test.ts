// The sampling checks each engine makes of a request (src/sim/requestChecks.ts, src/sim/mlxRequest.ts): vLLM's
// SamplingParams._verify_args and SGLang's SamplingParams.verify answer 400 with their own words; mlx-lm raises in
// validate_model_parameters and closes the connection with no response at all (so a top_k of -1, which it refuses,
// is a transport failure against the real server: the agent sends mlx 0 for "off").
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parseArgs } from "../../src/sim/args.ts"
import { type GenRequest, type Invalid, isInvalid, validate } from "../../src/sim/request.ts"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

const vllm = parseArgs(["serve", "org/m"])
const sglang = parseArgs(["--model-path", "org/m"])
const mlx = parseArgs(["--model", "mlx/m"])

const check = (cfg: typeof vllm, body: Record<string, unknown>): GenRequest | Invalid =>
  validate(cfg, "completion", { model: cfg.servedName, prompt: "a b", ...body }, JSON.stringify(body))

const refusal = (cfg: typeof vllm, body: Record<string, unknown>) => {
  const r = check(cfg, body)
  return isInvalid(r) ? { status: r.status, message: r.message, drop: r.drop === true } : "accepted"
}

describe("vLLM's sampling checks", () => {
  it.each([
    [{ temperature: -1 }, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"],
    [{ temperature: 2.5 }, "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)"],
    [{ top_p: 2 }, "top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)"],
    [{ top_p: 0 }, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)"],
    [{ top_k: -2 }, "top_k must be 0 (disable), or at least 1, got -2."],
    [{ presence_penalty: 3 }, "presence_penalty must be in [-2, 2], got 3.0."],
    [{ frequency_penalty: -3 }, "frequency_penalty must be in [-2, 2], got -3.0."],
    [{ repetition_penalty: 0 }, "repetition_penalty must be greater than zero, got 0.0."],
    [{ min_p: 1.5 }, "min_p must be in [0, 1], got 1.5."]
  ])("%j: 400 %s", (body, message) => {
    expect(refusal(vllm, body)).toEqual({ status: 400, message, drop: false })
  })

  it("takes -1 and 0 for top_k (off), a repetition penalty above 2, and nulls as the defaults", () => {
    for (const body of [{ top_k: -1 }, { top_k: 0 }, { repetition_penalty: 5 }, { temperature: null, top_p: null }])
      expect(refusal(vllm, body)).toBe("accepted")
  })
})

describe("SGLang's sampling checks", () => {
  it.each([
    [{ temperature: -0.5 }, "temperature must be a non-negative finite number, got -0.5."],
    [{ top_p: 1.5 }, "top_p must be in (0, 1], got 1.5."],
    [{ top_k: 0, temperature: 1 }, "top_k must be -1 (disable) or at least 1, got 0."],
    [{ repetition_penalty: 3 }, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3.0."],
    [{ presence_penalty: 2.5 }, "presence_penalty must be in [-2, 2], got 2.5."]
  ])("%j: 400 %s", (body, message) => {
    expect(refusal(sglang, body)).toEqual({ status: 400, message, drop: false })
  })

  it("reads top_k 0 at temperature 0 as greedy (top_k 1), and -1 as the whole vocabulary", () => {
    expect(refusal(sglang, { top_k: 0, temperature: 0 })).toBe("accepted")
    expect(refusal(sglang, { top_k: -1 })).toBe("accepted")
  })
})

describe("mlx-lm's parameter checks", () => {
  it.each([
    [{ top_k: -1 }, "top_k must be a non-negative integer"],
    [{ temperature: -1 }, "temperature must be a non-negative float"],
    [{ top_p: 1.5 }, "top_p must be a float between 0 and 1"],
    [{ max_tokens: -1 }, "max_tokens must be a non-negative integer"],
    [{ stream: "yes" }, "stream must be a boolean"],
    [{ seed: 1.5 }, "seed must be an integer"],
    [{ top_logprobs: 11 }, "top_logprobs must be between 1 and 10 but got 11"]
  ])("%j: no response (%s)", (body, message) => {
    expect(refusal(mlx, body)).toEqual({ status: 0, message, drop: true })
  })

  it("takes top_k 0 (off), max_tokens 0 and a repetition penalty of 0", () => {
    for (const body of [{ top_k: 0 }, { max_tokens: 0 }, { repetition_penalty: 0 }])
      expect(refusal(mlx, body)).toBe("accepted")
  })

  it("a body without prompt fails the handler's assert: no response either", () => {
    const r = validate(mlx, "completion", { model: "mlx/m" }, "{}")
    expect(isInvalid(r) && r.drop).toBe(true)
  })
})

describe("over HTTP", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
    await pollUntil(async () => ((await getJson(`${sim.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
  })
  afterAll(() => sim?.stop())

  it("mlx closes the connection with no response for top_k -1, and answers top_k 0", async () => {
    const body = { model: "mlx-community/tiny", prompt: "a b", max_tokens: 2 }
    await expect(postJson(`${sim.url}/v1/completions`, { ...body, top_k: -1 })).rejects.toThrow()
    expect((await postJson(`${sim.url}/v1/completions`, { ...body, top_k: 0 })).status).toBe(200)
  })
})
