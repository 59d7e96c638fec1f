// Differential check of the llama_cpp simulator against the real llama-server: API keys (tools/server/server-http.cpp
// middleware_validate_api_key; common/arg.cpp --api-key, --api-key-file, LLAMA_API_KEY) and two ways a body fails to
// be read (cpp-httplib's multipart boundary, nlohmann's lone surrogate). Both servers start with the same keys, from
// the flag (with LLAMA_API_KEY beside it, which adds to it), from a key file, and from the environment alone; every
// route is asked with no key, wrong ones and right ones, as Bearer, bare and X-Api-Key. Statuses always, and where the
// real server refuses, its body and content type word for word.
import * as fs from "node:fs"
import * as path from "node:path"
import { Agent as UndiciAgent, fetch as undiciFetch } from "undici"
import { beforeAll, describe, expect, it } from "vitest"
import { BARE_400_TYPES, JSON_READ_TYPES, LONE_LOW_SURROGATES } from "../support/llamaBodyFacts.ts"
import { errorText } from "../support/llamaChatFacts.ts"
import { type Pair, pairs } from "./simPair.ts"

const diff = pairs("cgn-real-diff7-")
let flag: Pair
let file: Pair
let envOnly: Pair
let csvEnv: Pair

beforeAll(async () => {
  const keyFile = path.join(diff.dir, "keys.txt")
  fs.writeFileSync(keyFile, "# keys\nfk1\n\nfk2\n")
  ;[flag, file, envOnly, csvEnv] = [
    await diff.pair({ args: ["--metrics", "--api-key", "k1,k2"], env: { LLAMA_API_KEY: "envk" } }),
    await diff.pair({ args: ["--metrics", "--api-key-file", keyFile] }),
    await diff.pair({ args: ["--metrics"], env: { LLAMA_API_KEY: "envk" } }),
    await diff.pair({ args: ["--metrics"], env: { LLAMA_API_KEY: '"a,b",c,"d""e"' } })
  ]
}, 30 * 60_000)

interface Answer {
  readonly status: number
  readonly type: string | null
  readonly length: string | null
  readonly connection: string | null
  readonly body: string
}

/** One request on a connection of its own (llama-server closes one after an error). */
const request = async (base: string, p: string, headers: Record<string, string>, body?: string): Promise<Answer> => {
  const dispatcher = new UndiciAgent()
  try {
    const res = await undiciFetch(`${base}${p}`, {
      method: body === undefined ? "GET" : "POST",
      headers,
      ...(body === undefined ? {} : { body }),
      dispatcher
    })
    const h = res.headers
    const text = await res.text()
    return {
      status: res.status,
      type: h.get("content-type"),
      length: h.get("content-length"),
      connection: h.get("connection"),
      body: text
    }
  } finally {
    await dispatcher.close()
  }
}

/** What is compared: the status, and of a refusal its content type and body. */
const compared = (a: Answer) => (a.status === 200 ? [a.status] : [a.status, a.type, a.body])

const COMPLETION = JSON.stringify({ prompt: "a b", max_tokens: 2 })
const ROUTES: ReadonlyArray<[string, string | undefined]> = [
  ["/health", undefined],
  ["/v1/health", undefined],
  ["/v1/models", undefined],
  ["/props", undefined],
  ["/metrics", undefined],
  ["/v1/completions", COMPLETION]
]

/** The header sets each route is asked with: none, wrong keys, right ones in each way llama-server reads them. */
const headerSets = (right: string): ReadonlyArray<Record<string, string>> => [
  {},
  { authorization: "Bearer wrong" },
  { "x-api-key": "wrong" },
  { authorization: `Bearer ${right}` },
  { authorization: right },
  { authorization: `bearer ${right}` },
  { "x-api-key": right },
  { authorization: "Bearer wrong", "x-api-key": right }
]

const sweep = async (pair: Pair, rights: ReadonlyArray<string>) => {
  const rows: Array<unknown> = []
  for (const right of rights)
    for (const headers of headerSets(right))
      for (const [p, body] of ROUTES) {
        const h = body === undefined ? headers : { "content-type": "application/json", ...headers }
        const [real, sim] = [await request(pair.real, p, h, body), await request(pair.sim, p, h, body)]
        rows.push([p, headers, ...compared(real), "|", ...compared(sim)])
      }
  return rows
}

/** Each row as it reads had the simulator answered as the real server did. */
const mirrored = (rows: Array<unknown>) =>
  rows.map((r) => {
    const row = r as Array<unknown>
    const bar = row.indexOf("|")
    return [...row.slice(0, bar + 1), ...row.slice(2, bar)]
  })

describe("API keys: the simulator against the real server", () => {
  it("--api-key k1,k2 with LLAMA_API_KEY beside it: every key taken, the same refusals", async () => {
    const rows = await sweep(flag, ["k1", "k2", "envk"])
    expect(rows).toEqual(mirrored(rows))
    // the refusal is there to compare
    expect(rows.some((r) => (r as Array<unknown>)[2] === 401)).toBe(true)
  })

  it("--api-key-file: a key a line, # lines skipped", async () => {
    const rows = await sweep(file, ["fk1", "fk2", "# keys"])
    expect(rows).toEqual(mirrored(rows))
  })

  it("LLAMA_API_KEY alone", async () => {
    const rows = await sweep(envOnly, ["envk"])
    expect(rows).toEqual(mirrored(rows))
  })

  it("LLAMA_API_KEY as a CSV row (parse_csv_row): a quoted field keeps its comma, a doubled quote is one", async () => {
    const rows = await sweep(csvEnv, ["a,b", "c", 'd"e', '"a', "a"])
    expect(rows).toEqual(mirrored(rows))
    // the keys test/sim/api-key.test.ts pins: taken by the real server; a piece of one is not
    const real = async (key: string) =>
      (await request(csvEnv.real, "/v1/models", { authorization: `Bearer ${key}` })).status
    expect([await real("a,b"), await real("c"), await real('d"e'), await real("a")]).toEqual([200, 200, 200, 401])
  })
})

describe("a body that cannot be read: the simulator against the real server", () => {
  const KEY = { authorization: "Bearer k1" }

  it("multipart/form-data without a usable boundary: cpp-httplib's bare 400, the connection closed", async () => {
    for (const type of ["multipart/form-data", "multipart/form-data; charset=utf-8", "multipart/form-data; boundary="])
      for (const p of ["/v1/completions", "/v1/chat/completions", "/tokenize"]) {
        const h = { ...KEY, "content-type": type }
        const [real, sim] = [await request(flag.real, p, h, COMPLETION), await request(flag.sim, p, h, COMPLETION)]
        expect([type, p, sim]).toEqual([type, p, real])
        expect(real.status).toBe(400)
      }
  })

  it("the measured content types (llamaBodyFacts.ts): the boundary's bound, the media type trimmed and case-sensitive", async () => {
    for (const type of [...BARE_400_TYPES, ...JSON_READ_TYPES])
      for (const p of ["/v1/completions", "/tokenize"]) {
        const h = { ...KEY, "content-type": type }
        const [real, sim] = [await request(flag.real, p, h, COMPLETION), await request(flag.sim, p, h, COMPLETION)]
        expect([type, p, ...compared(sim), sim.connection]).toEqual([type, p, ...compared(real), real.connection])
        expect([type, real.status]).toEqual([type, BARE_400_TYPES.includes(type) ? 400 : 200])
      }
  })

  it("a lone UTF-16 surrogate escape: nlohmann's parse error, word for word", async () => {
    const bodies = [
      '{"prompt":"\\ud800","max_tokens":2}',
      '{\n "prompt": ["\u00e9\\udc00x"]}',
      '{"\\ud800\\u0041":1}',
      '{"content":"a\\ud800\\n"}',
      '{"prompt":"\\ud83d\\ude00 ok \\udbff","max_tokens":2}'
    ]
    for (const body of bodies)
      for (const p of ["/v1/completions", "/tokenize", "/apply-template"]) {
        const h = { ...KEY, "content-type": "application/json" }
        const [real, sim] = [await request(flag.real, p, h, body), await request(flag.sim, p, h, body)]
        expect([body, p, ...compared(sim)]).toEqual([body, p, ...compared(real)])
        expect(real.status).toBe(500)
      }
    // the measured lone low surrogates (llamaBodyFacts.ts), the real server's words as they are pinned
    for (const f of LONE_LOW_SURROGATES)
      for (const p of ["/v1/completions", "/tokenize"]) {
        const h = { ...KEY, "content-type": "application/json" }
        const [real, sim] = [await request(flag.real, p, h, f.body), await request(flag.sim, p, h, f.body)]
        expect([f.body, p, real.status, real.body]).toEqual([f.body, p, 500, errorText(500, f.message)])
        expect([f.body, p, ...compared(sim)]).toEqual([f.body, p, ...compared(real)])
      }
  })
})
