// Pins on the llama_cpp simulator's plumbing that the differential tests compare only by shape: the slot pick by
// prompt similarity (server-context.cpp get_available_slot), /tokenize's and /detokenize's defaults and bounds
// (post_tokenize, post_detokenize, llama-vocab token_to_piece), a chat stream's held-back tokens
// (to_json_oaicompat_chat writes no chunk for an empty diff), the assistant prefill, the command-line reading
// (common/arg.cpp values, argparse nargs='+'), the refusal of unknown flags, a labelled metric family before its
// first sample, and cpp-httplib's keep-alive. Each case was found by a mutation no other test caught.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { unknownFlagsRefusal } from "../../src/sim/argRefusal.ts"
import { parseArgs } from "../../src/sim/args.ts"
import { parseDuration } from "../../src/sim/commandLine.ts"
import { LLAMA_KEEP_ALIVE_S } from "../../src/sim/context.ts"
import { SlotBook, type SlotTask } from "../../src/sim/llamaSlots.ts"
import { N_VOCAB } from "../../src/sim/tokens.ts"
import { getJson, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const task: SlotTask = {
  promptTokens: 3,
  nPredict: 4,
  chat: false,
  stream: false,
  seed: undefined,
  ignoreEos: false,
  nProbs: 0,
  timingsPerToken: false,
  postSamplingProbs: false
}

/** A book whose idle slot 0 holds `held` (a finished task's tokens) and slot 1 nothing. */
const bookHolding = (held: Array<string>): SlotBook => {
  const book = new SlotBook()
  book.start(0, task, held, book.reserve(1), false)
  return book
}

describe("slot pick by prompt similarity (get_available_slot)", () => {
  it("-sps 0 turns the rule off: a slot sharing a prefix is not preferred (the LRU rule decides)", () => {
    const book = bookHolding(["<s>", "a", "b"])
    // half the task's tokens shared: picked at the default 0.1, not at 0
    expect(book.similar([0, 1], ["<s>", "a", "c", "d"], 0.1)).toBe(0)
    expect(book.similar([0, 1], ["<s>", "a", "c", "d"], 0)).toBeUndefined()
  })

  it("a similarity equal to the threshold does not count (sim_cur > slot_prompt_similarity)", () => {
    const book = bookHolding(["<s>", "a", "b"])
    expect(book.similar([0, 1], ["<s>", "a", "c", "d"], 0.5)).toBeUndefined()
    expect(book.similar([0, 1], ["<s>", "a", "c", "d"], 0.49)).toBe(0)
  })
})

describe("llama_cpp routes", () => {
  let sim: SimHandle
  beforeAll(async () => {
    sim = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf("tiny.gguf")] })
  })
  afterAll(async () => {
    await sim?.stop()
  })

  it("/tokenize adds the BOS only when asked (add_special defaults to false)", async () => {
    const plain = await postJson(`${sim.url}/tokenize`, { content: "hello world" })
    const special = await postJson(`${sim.url}/tokenize`, { content: "hello world", add_special: true })
    const tokens = (r: { json: unknown }) => (r.json as { tokens: Array<number> }).tokens
    expect(tokens(special)).toEqual([1, ...tokens(plain)])
    expect(tokens(plain)).not.toContain(1)
  })

  it("/detokenize refuses the id n_vocab itself (std::vector::at), accepts n_vocab - 1", async () => {
    const last = await postJson(`${sim.url}/detokenize`, { tokens: [N_VOCAB - 1] })
    expect(last.status).toBe(200)
    const past = await postJson(`${sim.url}/detokenize`, { tokens: [N_VOCAB] })
    expect(past.status).toBe(500)
    expect(past.text).toContain(`__n (which is ${N_VOCAB}) >= this->size() (which is ${N_VOCAB})`)
  })

  it.each(["/tokenize", "/detokenize", "/apply-template"])(
    "%s answers a body that is not JSON 500 (json::parse)",
    async (route) => {
      const res = await fetch(`${sim.url}${route}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: "nope"
      })
      expect(res.status).toBe(500)
      expect(await res.text()).toContain("[json.exception.parse_error.101]")
    }
  )

  it("a chat stream writes no chunk for a token whose text is held back as a possible stop string", async () => {
    const res = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: "alpha beta gamma delta" }],
        max_tokens: 8,
        stream: true,
        // " beta" ends with "beta", the start of "betaX": held until " gamma" shows it is not the stop
        stop: ["betaX"]
      })
    })
    const contents = sseData(await res.text())
      .filter((d) => d !== "[DONE]")
      .map((d) => (JSON.parse(d) as { choices: Array<{ delta: { content?: unknown } }> }).choices[0]?.delta.content)
      .filter((c) => c !== undefined)
    expect(contents).toEqual([null, "alpha", " beta gamma", " delta"])
  })

  it("an assistant prefill leads the answer, a space before the first generated word", async () => {
    const r = await postJson(`${sim.url}/v1/chat/completions`, {
      messages: [
        { role: "user", content: "alpha beta gamma delta" },
        { role: "assistant", content: "Hello" }
      ],
      max_tokens: 3
    })
    const content = (r.json as { choices: Array<{ message: { content: string } }> }).choices[0]?.message.content
    expect(content).toBe("Hello alpha beta gamma")
  })
})

describe("command line", () => {
  it("a bare number is a duration in ms", () => {
    expect(parseDuration("250")).toBe(250)
  })

  it("-np anywhere on a line means llama_cpp", () => {
    expect(parseArgs(["--host", "h", "-m", "/x.gguf", "-np", "2"]).flavor).toBe("llama_cpp")
  })

  it("a negative number after a flag is its value (--sse-ping-interval -1: no pings)", () => {
    const c = parseArgs(["-m", "/x.gguf", "--sse-ping-interval", "-1", "-ngl", "-1"])
    expect(c.ssePingMs).toBeUndefined()
    expect(parseArgs(["-m", "/x.gguf"]).ssePingMs).toBe(30_000)
    expect(c.unmodelled).toEqual([])
  })

  it("--served-model-name takes several names (nargs='+'): the first served, none read as the model", () => {
    const c = parseArgs(["--served-model-name", "a", "b", "--port", "9"])
    expect(c).toMatchObject({ flavor: "vllm", servedName: "a", model: "facebook/opt-125m", port: 9 })
  })

  it("-np is a flag llama-server knows: a line with it has nothing unmodelled", () => {
    expect(parseArgs(["-m", "/x.gguf", "-c", "4096", "-np", "2", "--metrics"]).unmodelled).toEqual([])
  })

  it("llama-server names only the first unknown flag (common_params_parse throws at it)", () => {
    expect(unknownFlagsRefusal("llama_cpp", ["--foo", "--bar"]).lines).toEqual([
      { stream: "stderr", text: "error: invalid argument: --foo" }
    ])
  })
})

describe("metric pages", () => {
  it("a labelled family with no sample yet is left out (SGLang's realtime_tokens_total before a request)", async () => {
    const sim = await startSim({ flavor: "sglang", args: ["--model-path", "org/m", "--enable-metrics"] })
    try {
      const page = await getJson(`${sim.url}/metrics`)
      expect(page.text).toContain("sglang:prompt_tokens_total")
      expect(page.text).not.toContain("sglang:realtime_tokens_total")
    } finally {
      await sim.stop()
    }
  })
})

describe("keep-alive", () => {
  // Pinned as a value: the idle close itself takes cpp-httplib's 5 s to observe (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND).
  it("llama-server keeps an idle connection 5 s", () => {
    expect(LLAMA_KEEP_ALIVE_S).toBe(5)
  })
})
