// Stop strings (`stop`) on the vLLM, SGLang and mlx-lm flavors, as each engine's source handles them (the
// llama.cpp flavor's are held to the real llama-server in test/sim/llama-requests.test.ts and test/real/):
// - vLLM (vllm/v1/engine/detokenizer.py): the first stop string of the list that completes in a token's text cuts
//   the text before it (after it with include_stop_str_in_output), finish "stop" with `stop_reason` naming it; a
//   stream holds back the longest stop's length less one character until the sequence ends. It is checked on
//   the max_tokens-th token too, so it wins over "length". An empty stop string is a 400.
// - SGLang (schedule_batch.py check_finished, detokenizer_manager.py trim_matched_stop): finish "stop" with
//   `matched_stop`, the text cut at the stop unless no_stop_trim; nothing is held back, so a stop that began in
//   an earlier token leaves that part streamed; "length" is checked first, so on the max_tokens-th token the stop
//   is not looked for; an end of sequence reports the EOS token id as `matched_stop`.
// - mlx-lm (mlx_lm/server.py stopping_criteria, sequence_overlap): the stop matches as token ids, the text loses
//   the stop's characters and usage its tokens; a stream holds tokens that begin a stop and drops them when it
//   completes; no field names the stop.
// Prompt words are the echo mode's tokens: "one", " two", " three", " four", " five".
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SIM_EOS_TOKEN_ID } from "../../src/sim/stopRules.ts"
import { getJson, pollUntil, postJson, type SimHandle, sseData, startSim } from "../support/sim.ts"

let vllm: SimHandle
let sglang: SimHandle
let mlx: SimHandle

beforeAll(async () => {
  ;[vllm, sglang, mlx] = await Promise.all([
    startSim({ flavor: "vllm", args: ["serve", "org/m"] }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/sg"] }),
    startSim({ flavor: "mlx", args: ["--model", "mlx-community/tiny"] })
  ])
  await Promise.all(
    [sglang, mlx].map((s) =>
      pollUntil(async () => ((await getJson(`${s.url}/sim/state`)).json as { ready: boolean }).ready || undefined)
    )
  )
})
afterAll(() => Promise.all([vllm, sglang, mlx].map((s) => s?.stop())))

const PROMPT = "one two three four five"
type Choice = Record<string, unknown> & {
  text?: string
  delta?: { content?: string }
  message?: { content?: string }
  finish_reason: string | null
}
type Body = { choices: Array<Choice>; usage?: { completion_tokens: number } }

const complete = async (sim: SimHandle, extra: Record<string, unknown>): Promise<Body> => {
  const r = await postJson(`${sim.url}/v1/completions`, { prompt: PROMPT, max_tokens: 50, ...extra })
  expect(r.status).toBe(200)
  return r.json as Body
}
const chat = async (sim: SimHandle, extra: Record<string, unknown>): Promise<Body> => {
  const messages = [{ role: "user", content: PROMPT }]
  const r = await postJson(`${sim.url}/v1/chat/completions`, { messages, max_tokens: 50, ...extra })
  expect(r.status).toBe(200)
  return r.json as Body
}
/** A stream's chunks (without [DONE]). */
const chunks = async (sim: SimHandle, path: string, extra: Record<string, unknown>): Promise<Array<Body>> => {
  const input = path.includes("chat") ? { messages: [{ role: "user", content: PROMPT }] } : { prompt: PROMPT }
  const r = await postJson(`${sim.url}${path}`, { ...input, max_tokens: 50, ...extra, stream: true })
  expect(r.status).toBe(200)
  const data = sseData(r.text)
  expect(data.at(-1)).toBe("[DONE]")
  return data.slice(0, -1).map((d) => JSON.parse(d) as Body)
}
const texts = (cs: ReadonlyArray<Body>) => cs.filter((c) => c.choices.length > 0).map((c) => c.choices[0]?.text)
const contents = (cs: ReadonlyArray<Body>) =>
  cs.filter((c) => c.choices.length > 0).map((c) => c.choices[0]?.delta?.content)
const finishes = (cs: ReadonlyArray<Body>) =>
  cs.filter((c) => c.choices.length > 0).map((c) => c.choices[0]?.finish_reason)

describe("vLLM", () => {
  it("cuts the text before the stop string, finish stop, stop_reason naming it; a string or a list", async () => {
    for (const stop of [" three", [" three"], ["zzz", " three"]]) {
      const c = await complete(vllm, { stop })
      expect(c.choices[0]).toMatchObject({ text: "one two", finish_reason: "stop", stop_reason: " three" })
      expect(c.usage?.completion_tokens).toBe(3)
    }
    const m = await chat(vllm, { stop: [" three"] })
    expect(m.choices[0]).toMatchObject({
      message: { content: "one two" },
      finish_reason: "stop",
      stop_reason: " three"
    })
  })

  it("takes the first stop string of the list that completes, not the one that starts first", async () => {
    const c = await complete(vllm, { stop: [" two", "one two"] })
    expect(c.choices[0]).toMatchObject({ text: "one", stop_reason: " two" })
  })

  it("streams with the longest stop's length less one character held back, released with the finish", async () => {
    const cs = await chunks(vllm, "/v1/completions", { stop: [" three"] })
    expect(texts(cs)).toEqual(["", "on", "e two"])
    expect(finishes(cs)).toEqual([null, null, "stop"])
    expect(cs.at(-1)?.choices[0]?.stop_reason).toBe(" three")
    expect(cs[0]?.choices[0]?.stop_reason).toBeNull()
    // No stop string met: the held characters go out with the last token, stop_reason null (end of sequence).
    const free = await chunks(vllm, "/v1/completions", { stop: ["zzz"] })
    expect(texts(free)).toEqual(["o", "ne t", "wo thr", "ee fo", "ur five"])
    expect(free.at(-1)?.choices[0]).toMatchObject({ finish_reason: "stop", stop_reason: null })
    const ch = await chunks(vllm, "/v1/chat/completions", { stop: " three" })
    // The role chunk, one chunk per token (empty while held), the last with the rest and the finish.
    expect(contents(ch)).toEqual(["", "", "on", "e two"])
    expect(ch.at(-1)?.choices[0]).toMatchObject({ finish_reason: "stop", stop_reason: " three" })
  })

  it("a stop string on the max_tokens-th token still ends it with stop; before it, length", async () => {
    expect((await complete(vllm, { stop: [" three"], max_tokens: 3 })).choices[0]).toMatchObject({
      text: "one two",
      finish_reason: "stop",
      stop_reason: " three"
    })
    const cs = await chunks(vllm, "/v1/completions", { stop: [" three"], max_tokens: 2 })
    expect(texts(cs)).toEqual(["", "one two"])
    expect(cs.at(-1)?.choices[0]).toMatchObject({ finish_reason: "length", stop_reason: null })
  })

  it("include_stop_str_in_output keeps the stop string and holds nothing back", async () => {
    const c = await complete(vllm, { stop: [" three"], include_stop_str_in_output: true })
    expect(c.choices[0]).toMatchObject({ text: "one two three", finish_reason: "stop", stop_reason: " three" })
    const cs = await chunks(vllm, "/v1/completions", { stop: [" three"], include_stop_str_in_output: true })
    expect(texts(cs)).toEqual(["one", " two", " three"])
  })

  it("refuses an empty stop string (400)", async () => {
    const r = await postJson(`${vllm.url}/v1/completions`, { prompt: PROMPT, stop: ["x", ""] })
    expect(r.status).toBe(400)
    expect(r.json).toMatchObject({ error: { message: "stop cannot contain an empty string.", code: 400 } })
  })
})

describe("SGLang", () => {
  it("cuts the text at the stop string, finish stop, matched_stop naming it", async () => {
    const c = await complete(sglang, { stop: " three" })
    expect(c.choices[0]).toMatchObject({ text: "one two", finish_reason: "stop", matched_stop: " three" })
    expect(c.choices[0]).not.toHaveProperty("stop_reason")
    expect(c.usage?.completion_tokens).toBe(3)
    const m = await chat(sglang, { stop: [" three"] })
    expect(m.choices[0]).toMatchObject({
      message: { content: "one two" },
      finish_reason: "stop",
      matched_stop: " three"
    })
    // no_stop_trim keeps it.
    expect((await complete(sglang, { stop: [" three"], no_stop_trim: true })).choices[0]).toMatchObject({
      text: "one two three",
      matched_stop: " three"
    })
  })

  it("streams without holding back: completions end with the cut rest, chat with a finish chunk of its own", async () => {
    const cs = await chunks(sglang, "/v1/completions", { stop: [" three"] })
    expect(texts(cs)).toEqual(["one", " two", ""])
    expect(finishes(cs)).toEqual([null, null, "stop"])
    expect(cs.map((c) => c.choices[0]?.matched_stop)).toEqual([null, null, " three"])
    const ch = await chunks(sglang, "/v1/chat/completions", { stop: [" three"] })
    // No content chunk for the stopping token (its text is empty).
    expect(contents(ch)).toEqual(["", "one", " two", undefined])
    expect(ch.at(-1)?.choices[0]).toMatchObject({ delta: {}, finish_reason: "stop", matched_stop: " three" })
  })

  it("a stop that began in a token already streamed leaves that part sent", async () => {
    const cs = await chunks(sglang, "/v1/completions", { stop: ["e t"] })
    expect(texts(cs)).toEqual(["one", ""])
    expect((await complete(sglang, { stop: ["e t"] })).choices[0]?.text).toBe("on")
  })

  it("on the max_tokens-th token length wins and the stop string stays in the text", async () => {
    const c = await complete(sglang, { stop: [" three"], max_tokens: 3 })
    expect(c.choices[0]).toMatchObject({ text: "one two three", finish_reason: "length", matched_stop: null })
  })

  it("an end of sequence names the EOS token id", async () => {
    const c = await complete(sglang, { stop: ["zzz"] })
    expect(c.choices[0]).toMatchObject({ text: PROMPT, finish_reason: "stop", matched_stop: SIM_EOS_TOKEN_ID })
  })
})

describe("mlx-lm", () => {
  it("matches the stop as tokens: the text and the usage lose it, no field names it", async () => {
    const c = await complete(mlx, { stop: [" three"] })
    expect(c.choices[0]).toMatchObject({ text: "one two", finish_reason: "stop" })
    expect(c.choices[0]).not.toHaveProperty("stop_reason")
    expect(c.choices[0]).not.toHaveProperty("matched_stop")
    expect(c.usage?.completion_tokens).toBe(2)
    expect((await chat(mlx, { stop: " three" })).choices[0]).toMatchObject({
      message: { content: "one two" },
      finish_reason: "stop"
    })
    // "three" is not the token " three": no stop.
    const miss = await complete(mlx, { stop: ["three"] })
    expect(miss.choices[0]).toMatchObject({ text: PROMPT, finish_reason: "stop" })
    expect(miss.usage?.completion_tokens).toBe(5)
  })

  it("streams holding the tokens that begin a stop, dropped when it completes, sent when it does not", async () => {
    const stopped = await chunks(mlx, "/v1/completions", {
      stop: [" three four"],
      stream_options: { include_usage: true }
    })
    expect(texts(stopped)).toEqual(["one", " two", ""])
    expect(finishes(stopped)).toEqual([null, null, "stop"])
    expect(stopped.at(-1)?.usage?.completion_tokens).toBe(2)
    const released = await chunks(mlx, "/v1/completions", { stop: [" three five"] })
    expect(texts(released)).toEqual(["one", " two", " three four", " five", ""])
    // Held at max_tokens: the rest goes out with the finish chunk.
    const capped = await chunks(mlx, "/v1/completions", { stop: [" three four"], max_tokens: 3 })
    expect(texts(capped)).toEqual(["one", " two", " three"])
    expect(finishes(capped)).toEqual([null, null, "length"])
  })
})
