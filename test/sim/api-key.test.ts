// API keys in the simulator as each engine takes and checks them (src/sim/apiKey.ts): where the keys come from (flag,
// environment, key file), which requests pass without one, how the header is read, and the refusal's exact answer.
// mlx-lm has no API key: its parser refuses the flag.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { apiKeySources } from "../../src/sim/apiKey.ts"
import { type SimHandle, simEntry, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sim-api-key-"))
const keyFile = path.join(dir, "keys.txt")
fs.writeFileSync(keyFile, "# a comment\nfile-k1\n\n#file-k0\nfile-k2\n")

let llama: SimHandle
let llamaFile: SimHandle
let vllm: SimHandle
let vllmEnv: SimHandle
let sglang: SimHandle

beforeAll(async () => {
  ;[llama, llamaFile, vllm, vllmEnv, sglang] = await Promise.all([
    // LLAMA_API_KEY and --api-key add up: llama.cpp reads the environment first, then the flag appends
    startSim({
      flavor: "llama_cpp",
      args: ["-m", simGguf("m.gguf"), "--api-key", "k1,,k2"],
      env: { LLAMA_API_KEY: "env-k" }
    }),
    startSim({ flavor: "llama_cpp", args: ["-m", simGguf("m.gguf"), "--metrics", "--api-key-file", keyFile] }),
    // the flag wins over VLLM_API_KEY
    startSim({ flavor: "vllm", args: ["serve", "org/m", "--api-key", "vk"], env: { VLLM_API_KEY: "env-vk" } }),
    startSim({ flavor: "vllm", args: ["serve", "org/m"], env: { VLLM_API_KEY: "env-vk" } }),
    startSim({ flavor: "sglang", args: ["--model-path", "org/m", "--api-key", "sk", "--enable-metrics"] })
  ])
})
afterAll(async () => {
  await Promise.all([llama, llamaFile, vllm, vllmEnv, sglang].map((s) => s?.stop()))
  fs.rmSync(dir, { recursive: true, force: true })
})

/** One request's status, content type and body. */
const ask = async (s: SimHandle, p: string, headers: Record<string, string> = {}, method = "GET") => {
  const post = method === "POST"
  const res = await fetch(`${s.url}${p}`, {
    method,
    headers: post ? { "content-type": "application/json", ...headers } : headers,
    ...(post ? { body: JSON.stringify({ prompt: "a b", max_tokens: 2 }) } : {})
  })
  return { status: res.status, type: res.headers.get("content-type"), body: await res.text() }
}
const status = async (s: SimHandle, p: string, headers: Record<string, string> = {}, method = "GET") =>
  (await ask(s, p, headers, method)).status

const LLAMA_401 = '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'

describe("llama_cpp (tools/server/server-http.cpp middleware_validate_api_key)", () => {
  it("refuses a request without a key, or with a wrong one, in llama-server's words and content type", async () => {
    const want = { status: 401, type: "application/json; charset=utf-8", body: LLAMA_401 }
    expect(await ask(llama, "/v1/models")).toEqual(want)
    expect(await ask(llama, "/v1/completions", { authorization: "Bearer nope" }, "POST")).toEqual(want)
    expect(await ask(llama, "/props", { "x-api-key": "k3" })).toEqual(want)
  })

  it("takes each key of the list, from Authorization (Bearer cut as written) or else X-Api-Key, and LLAMA_API_KEY's", async () => {
    expect(await status(llama, "/v1/models", { authorization: "Bearer k1" })).toBe(200)
    expect(await status(llama, "/v1/models", { authorization: "k2" })).toBe(200)
    expect(await status(llama, "/v1/completions", { "x-api-key": "k2" }, "POST")).toBe(200)
    expect(await status(llama, "/v1/models", { authorization: "Bearer env-k" })).toBe(200)
    // "bearer " in another case is not cut; a wrong Authorization is not saved by a right X-Api-Key
    expect(await status(llama, "/v1/models", { authorization: "bearer k1" })).toBe(401)
    expect(await status(llama, "/v1/models", { authorization: "Bearer x", "x-api-key": "k1" })).toBe(401)
    // the empty field of "k1,,k2" is no key
    expect(await status(llama, "/v1/models", { authorization: "Bearer " })).toBe(401)
  })

  it("lets /health, /v1/health and OPTIONS through without a key; /metrics and unknown paths are guarded", async () => {
    expect(await status(llama, "/health")).toBe(200)
    expect(await status(llama, "/v1/health")).toBe(200)
    expect(await status(llama, "/v1/models", {}, "OPTIONS")).toBe(200)
    expect(await status(llama, "/metrics")).toBe(401)
    expect(await status(llama, "/nope")).toBe(401)
    expect(await status(llama, "/nope", { authorization: "Bearer k1" })).toBe(404)
  })

  it("reads --api-key-file: a key a line, # lines and empty ones skipped", async () => {
    expect(await status(llamaFile, "/metrics", { authorization: "Bearer file-k1" })).toBe(200)
    expect(await status(llamaFile, "/v1/models", { "x-api-key": "file-k2" })).toBe(200)
    expect(await status(llamaFile, "/v1/models", { authorization: "Bearer #file-k0" })).toBe(401)
    expect(await status(llamaFile, "/v1/models", { authorization: "Bearer # a comment" })).toBe(401)
    expect(await status(llamaFile, "/v1/models")).toBe(401)
  })

  it("a key file that cannot be opened stops the start with llama.cpp's parse error, exit 1", () => {
    const missing = path.join(dir, "none.txt")
    const p = spawnSync(
      process.execPath,
      [simEntry, "--flavor", "llama_cpp", "-m", "/m.gguf", "--port", "0", "--api-key-file", missing],
      { encoding: "utf8", timeout: 20_000 }
    )
    expect(p.status).toBe(1)
    expect(p.stderr).toContain(
      `error while handling argument "--api-key-file": error: failed to open file '${missing}'\n\n\nusage:\n--api-key-file FNAME`
    )
    expect(p.stderr).not.toContain('"msg":"listening"')
  })
})

describe("vllm (vllm/entrypoints/openai/server_utils.py AuthenticationMiddleware)", () => {
  it("refuses a guarded path without the key: 401 {error: Unauthorized}", async () => {
    const want = { status: 401, type: "application/json", body: '{"error":"Unauthorized"}' }
    expect(await ask(vllm, "/v1/models")).toEqual(want)
    expect(await ask(vllm, "/v1/completions", { authorization: "Bearer env-vk" }, "POST")).toEqual(want)
  })

  it("takes `Bearer KEY` with the scheme in any case, the key exactly", async () => {
    expect(await status(vllm, "/v1/models", { authorization: "Bearer vk" })).toBe(200)
    expect(await status(vllm, "/v1/models", { authorization: "BEARER vk" })).toBe(200)
    expect(await status(vllm, "/v1/completions", { authorization: "bearer vk" }, "POST")).toBe(200)
    expect(await status(vllm, "/v1/models", { authorization: "Bearer  vk" })).toBe(401)
    expect(await status(vllm, "/v1/models", { authorization: "vk" })).toBe(401)
    expect(await status(vllm, "/v1/models", { "x-api-key": "vk" })).toBe(401)
  })

  it("leaves public endpoints, OPTIONS and unguarded unknown paths alone; guards by prefix", async () => {
    for (const p of ["/health", "/ping", "/metrics", "/version"]) expect(await status(vllm, p)).toBe(200)
    expect(await status(vllm, "/v1/models", {}, "OPTIONS")).not.toBe(401)
    expect(await status(vllm, "/nope")).toBe(404)
    expect(await status(vllm, "/v1nope")).toBe(401)
    expect(await status(vllm, "/tokenize", {}, "POST")).toBe(401)
    // SageMaker's route is guarded as the rest (server_utils.py's prefixes)
    expect(await status(vllm, "/invocations", {}, "POST")).toBe(401)
  })

  it("takes VLLM_API_KEY when no --api-key is given", async () => {
    expect(await status(vllmEnv, "/v1/models")).toBe(401)
    expect(await status(vllmEnv, "/v1/models", { authorization: "Bearer env-vk" })).toBe(200)
  })
})

describe("sglang (python/sglang/srt/utils/auth.py decide_request_auth)", () => {
  it("refuses every path but the public ones without the key: 401 {error: Unauthorized}", async () => {
    const want = { status: 401, type: "application/json", body: '{"error":"Unauthorized"}' }
    expect(await ask(sglang, "/v1/models")).toEqual(want)
    expect(await ask(sglang, "/v1/chat/completions", { authorization: "Bearer nope" }, "POST")).toEqual(want)
    expect(await ask(sglang, "/nope")).toEqual(want)
  })

  it("takes `Bearer KEY` (scheme in any case) or x-api-key", async () => {
    expect(await status(sglang, "/v1/models", { authorization: "Bearer sk" })).toBe(200)
    expect(await status(sglang, "/v1/models", { authorization: "bearer sk" })).toBe(200)
    expect(await status(sglang, "/v1/completions", { "x-api-key": "sk" }, "POST")).toBe(200)
    expect(await status(sglang, "/nope", { authorization: "Bearer sk" })).toBe(404)
    expect(await status(sglang, "/v1/models", { authorization: "sk" })).toBe(401)
  })

  it("lets /health*, /metrics* and OPTIONS through", async () => {
    expect(await status(sglang, "/health")).not.toBe(401)
    expect(await status(sglang, "/health_generate")).not.toBe(401)
    expect(await status(sglang, "/metrics")).toBe(200)
    expect(await status(sglang, "/v1/models", {}, "OPTIONS")).not.toBe(401)
    expect(await status(sglang, "/get_model_info")).toBe(401)
  })
})

describe("the keys each engine's command line and environment give (apiKeySources)", () => {
  it("llama.cpp reads LLAMA_API_KEY as a CSV row: a quoted field keeps its comma, a doubled quote is one", () => {
    // measured against llama-server: test/real/sim-differential-7.test.ts
    expect(apiKeySources("llama_cpp", [], { LLAMA_API_KEY: '"a,b",c,"d""e"' })).toEqual([{ keys: ["a,b", "c", 'd"e'] }])
  })

  it("vLLM and SGLang take `--api-key=V` as argparse does; vLLM's takes several words, SGLang's one, its last", () => {
    expect(apiKeySources("vllm", ["serve", "org/m", "--api-key=vk"], {})).toEqual([{ keys: ["vk"] }])
    expect(apiKeySources("vllm", ["--api-key", "a", "b", "--port", "1"], {})).toEqual([{ keys: ["a", "b"] }])
    expect(apiKeySources("sglang", ["--model-path", "org/m", "--api-key=sk"], {})).toEqual([{ keys: ["sk"] }])
    // nargs=None: one word (the next is no key); a flag given twice keeps its last value
    expect(apiKeySources("sglang", ["--api-key", "a", "b"], {})).toEqual([{ keys: ["a"] }])
    expect(apiKeySources("sglang", ["--api-key", "a", "--api-key", "b"], {})).toEqual([{ keys: ["b"] }])
  })
})

describe("the keys stay out of the logs", () => {
  it("no simulator logs a key", () => {
    const logs = [llama, llamaFile, vllm, vllmEnv, sglang].flatMap((s) => s.stderrLines).join("\n")
    for (const key of ["k1", "k2", "env-k", "file-k1", "vk", "env-vk", '"sk"']) expect(logs).not.toContain(key)
  })
})

describe("mlx (mlx_lm/server.py has no API key)", () => {
  it("refuses --api-key as argparse refuses an unknown flag, without --sim-strict-args", () => {
    const p = spawnSync(
      process.execPath,
      [simEntry, "--flavor", "mlx", "--model", "org/m", "--port", "0", "--api-key", "secret"],
      { encoding: "utf8", timeout: 20_000 }
    )
    expect(p.status).toBe(2)
    expect(p.stderr).toContain("mlx_lm.server: error: unrecognized arguments: --api-key\n")
    expect(p.stderr).not.toContain("secret")
  })
})
