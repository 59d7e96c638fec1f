// vLLM and SGLang without --max-model-len / --context-length: the simulated model's own context (4096, what
// /v1/models reports) holds every request, as the engines hold it to the model config's (vllm/config/model.py
// ModelConfig._get_and_verify_max_len then OpenAIServing._validate_input; python/sglang/srt/configs/model_config.py
// get_context_length then TokenizerManager._validate_one_request). The words are src/sim/contextLimit.ts's, the ones
// test/sim/error-shapes.test.ts holds for a limit given on the command line.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { getJson, pollUntil, postJson, type SimHandle, startSim } from "../support/sim.ts"

let vllm: SimHandle
let vllmOld: SimHandle
let sglang: SimHandle

beforeAll(async () => {
  ;[vllm, vllmOld, sglang] = await Promise.all([
    startSim({ flavor: "vllm", args: ["serve", "org/m"] }),
    startSim({ flavor: "vllm", args: ["serve", "org/m", "--sim-legacy-errors"] }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg"] })
  ])
  await pollUntil(
    async () => ((await getJson(`${sglang.url}/sim/state`)).json as { ready: boolean }).ready || undefined
  )
})
afterAll(() => Promise.all([vllm, vllmOld, sglang].map((s) => s?.stop())))

const prompt = (n: number) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ")
const complete = (s: SimHandle, body: Record<string, unknown>) => postJson(`${s.url}/v1/completions`, body)

describe("no context on the command line: the model's own, 4096 tokens", () => {
  it("/v1/models reports it", async () => {
    for (const s of [vllm, sglang]) {
      const { json } = await getJson(`${s.url}/v1/models`)
      expect((json as { data: Array<{ max_model_len: number }> }).data[0]?.max_model_len).toBe(4096)
    }
  })

  it("vLLM: max_tokens past it refused 400 with VLLMValidationError's words; a prompt of it too; filling it fits", async () => {
    const tooMany = await complete(vllm, { prompt: prompt(4000), max_tokens: 97 })
    expect([tooMany.status, tooMany.json]).toEqual([
      400,
      {
        error: {
          message:
            "'max_tokens' or 'max_completion_tokens' is too large: 97. This model's maximum context length is 4096 tokens and your request has 4000 input tokens (97 > 4096 - 4000). (parameter=max_tokens, value=97)",
          type: "BadRequestError",
          param: "max_tokens",
          code: 400
        }
      }
    ])
    const whole = await complete(vllm, { prompt: prompt(4096) })
    expect([whole.status, (whole.json as { error: { param: string } }).error.param]).toEqual([400, "input_tokens"])
    expect((await complete(vllm, { prompt: prompt(4000), max_tokens: 96 })).status).toBe(200)
  })

  it("vLLM before 0.10.1: the older words, flat", async () => {
    const r = await complete(vllmOld, { prompt: prompt(4000), max_tokens: 97 })
    expect([r.status, r.json]).toEqual([
      400,
      {
        object: "error",
        message:
          "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens (4000 in the messages, 97 in the completion). Please reduce the length of the messages or completion.",
        type: "BadRequestError",
        param: null,
        code: 400
      }
    ])
  })

  it("SGLang: input plus max_tokens past it refused 400 in TokenizerManager's words; filling it exactly fits (sgl-project/sglang#22546)", async () => {
    const r = await complete(sglang, { prompt: prompt(4000), max_tokens: 97 })
    expect([r.status, r.json]).toEqual([
      400,
      {
        object: "error",
        message:
          "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of 4097 tokens: 4000 tokens from the input messages and 97 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
        type: "BadRequestError",
        param: null,
        code: 400
      }
    ])
    const chat = await postJson(`${sglang.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "a b" }],
      max_tokens: 100_000
    })
    expect(chat.status).toBe(400)
    expect((await complete(sglang, { prompt: prompt(4000), max_tokens: 96 })).status).toBe(200)
  })
})
