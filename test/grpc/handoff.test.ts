// Handoff (pure): prefill and decode leg bodies for vLLM/NIXL and SGLang, checks of the handoff parameters
// and the bootstrap rendezvous, and leg planning per role, by tables.
import { Result } from "effect"
import { Status } from "nice-grpc-common"
import { describe, expect, it } from "vitest"
import type { JsonObject } from "../../src/services/engine/EngineClient.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import {
  extractKvTransferParams,
  InvalidHandoff,
  kvTransferDecodeBody,
  planLeg,
  VLLM_PREFILL_KV_TRANSFER_PARAMS,
  validateBootstrap,
  validateKvTransferParams,
  vllmPrefillBody
} from "../../src/services/grpc/Handoff.ts"
import { type BootstrapInput, bootstrapLegBody } from "../../src/services/grpc/SglangBootstrap.ts"
import { PREFILL_PARAMS } from "../support/nixlParams.ts"

const failure = <A>(r: Result.Result<A, InvalidHandoff>): InvalidHandoff => {
  if (Result.isSuccess(r)) throw new Error(`expected a failure, got ${JSON.stringify(r.success)}`)
  return r.failure
}
const success = <A>(r: Result.Result<A, InvalidHandoff>): A => {
  if (Result.isFailure(r)) throw new Error(`expected a success, got ${r.failure.message}`)
  return r.success
}

/** What a vLLM prefill engine returns (nixl/scheduler.py), plus fields newer builds add. */
const P_PARAMS = {
  ...PREFILL_PARAMS,
  remote_blocks_expiry_time: 1234.5
}

describe("vLLM prefill body (toy proxy rules)", () => {
  it.each<[string, JsonObject, JsonObject]>([
    [
      "chat: one token, the params that ask P to hold the blocks",
      { messages: [{ role: "user", content: "hi" }], max_tokens: 100, temperature: 0.5 },
      {
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 1,
        ignore_eos: true,
        temperature: 0.5,
        kv_transfer_params: VLLM_PREFILL_KV_TRANSFER_PARAMS
      }
    ],
    [
      "replaces kv_transfer_params the client sent",
      { prompt: "p", kv_transfer_params: { do_remote_prefill: true } },
      { prompt: "p", max_tokens: 1, ignore_eos: true, kv_transfer_params: VLLM_PREFILL_KV_TRANSFER_PARAMS }
    ],
    [
      // P hands off only a request that ends on its length: a stop string or EOS as the one token would not.
      "leaves the caller's stop sequences out and ignores the end-of-sequence token",
      { prompt: "p", stop: ["\n"], ignore_eos: false },
      { prompt: "p", max_tokens: 1, ignore_eos: true, kv_transfer_params: VLLM_PREFILL_KV_TRANSFER_PARAMS }
    ]
  ])("%s", (_name, body, expected) => {
    const before = structuredClone(body)
    expect(vllmPrefillBody(body)).toStrictEqual(expected)
    expect(body).toStrictEqual(before)
  })

  it("the prefill kv_transfer_params are exactly the toy proxy's", () => {
    expect(vllmPrefillBody({}).kv_transfer_params).toStrictEqual({
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null
    })
  })
})

describe("vLLM handoff parameters", () => {
  it("extracts the top-level kv_transfer_params of a prefill response, unchanged", () => {
    const response = { id: "x", object: "chat.completion", choices: [], kv_transfer_params: P_PARAMS }
    expect(success(extractKvTransferParams(response))).toStrictEqual(P_PARAMS)
  })

  it.each<[string, JsonObject, ReadonlyArray<string>]>([
    ["no kv_transfer_params", { choices: [] }, ["kv_transfer_params"]],
    ["kv_transfer_params null", { kv_transfer_params: null }, ["kv_transfer_params"]],
    [
      "P answered with its request-side params",
      { kv_transfer_params: VLLM_PREFILL_KV_TRANSFER_PARAMS },
      ["remote_block_ids", "remote_engine_id", "remote_host", "remote_port"]
    ]
  ])("prefill response with %s", (_name, response, missing) => {
    const e = failure(extractKvTransferParams(response))
    expect(e).toBeInstanceOf(InvalidHandoff)
    expect(e.missing).toStrictEqual(missing)
  })

  it.each<[string, unknown, ReadonlyArray<string>]>([
    ["empty block list", { ...P_PARAMS, remote_block_ids: [] }, ["remote_block_ids"]],
    ["empty block groups", { ...P_PARAMS, remote_block_ids: [[], []] }, ["remote_block_ids"]],
    ["no engine id", { ...P_PARAMS, remote_engine_id: undefined }, ["remote_engine_id"]],
    ["empty host, null port", { ...P_PARAMS, remote_host: "", remote_port: null }, ["remote_host", "remote_port"]],
    ["an empty request id", { ...P_PARAMS, remote_request_id: "" }, ["remote_request_id"]],
    ["a null request id", { ...P_PARAMS, remote_request_id: null }, ["remote_request_id"]],
    ["not an object", [1, 2], []],
    ["a string", "params", []]
  ])("decode side refuses %s", (_name, params, missing) => {
    const e = failure(validateKvTransferParams(params))
    expect(e.missing).toStrictEqual(missing)
    for (const m of missing) expect(e.message).toContain(m)
    expect(toGrpcFailure(e).code).toBe(Status.FAILED_PRECONDITION)
  })

  // A P/D fuzz: each reached the engine and came back as its failure (a pair retry), or worse, served by a local
  // prefill while P's blocks stayed held. P's request_finished never returns any of them.
  it.each<[string, unknown, string]>([
    [
      "no do_remote_prefill",
      (({ do_remote_prefill: _d, ...rest }) => rest)(P_PARAMS),
      "missing or empty do_remote_prefill"
    ],
    ["do_remote_prefill null", { ...P_PARAMS, do_remote_prefill: null }, "missing or empty do_remote_prefill"],
    [
      "do_remote_prefill a string",
      { ...P_PARAMS, do_remote_prefill: "true" },
      'do_remote_prefill must be true (the decode engine would prefill the prompt itself), got "true"'
    ],
    [
      "do_remote_decode true",
      { ...P_PARAMS, do_remote_decode: true },
      "do_remote_decode must not be true on a decode leg"
    ],
    // vLLM reads it by Python's truth test (NixlConnector update_state_after_alloc: `params.get("do_remote_decode")`)
    ...["false", 1, "no", [0], { a: 1 }].map((v): [string, unknown, string] => [
      `do_remote_decode ${JSON.stringify(v)} (true to Python)`,
      { ...P_PARAMS, do_remote_decode: v },
      "do_remote_decode must not be true on a decode leg"
    ]),
    ["a port as a string", { ...P_PARAMS, remote_port: "5600" }, 'remote_port must be a port, 1..65535, got "5600"'],
    ["port 70000", { ...P_PARAMS, remote_port: 70000 }, "remote_port must be a port, 1..65535, got 70000"],
    ["port -1", { ...P_PARAMS, remote_port: -1 }, "remote_port must be a port, 1..65535, got -1"],
    [
      "block ids that are not",
      { ...P_PARAMS, remote_block_ids: ["a", "b"] },
      'remote_block_ids must be the prefill engine\'s block ids (integers >= 0, or a list of them per group), got ["a","b"]'
    ],
    ["a fractional block id in a group", { ...P_PARAMS, remote_block_ids: [[1, 1.5]] }, "remote_block_ids must be"],
    ["an engine id that is a number", { ...P_PARAMS, remote_engine_id: 7 }, "remote_engine_id must be a string, got 7"],
    ["tp_size 0", { ...P_PARAMS, tp_size: 0 }, "tp_size must be an integer >= 1, got 0"]
  ])("decode side refuses %s, precisely (FAILED_PRECONDITION)", (_name, params, words) => {
    const e = failure(validateKvTransferParams(params))
    expect(e.message).toContain(words)
    expect(toGrpcFailure(e).code).toBe(Status.FAILED_PRECONDITION)
  })

  it("takes 6,000 block ids, and do_remote_decode false or absent", () => {
    const many = Array.from({ length: 6000 }, (_, i) => i)
    expect(Result.isSuccess(validateKvTransferParams({ ...P_PARAMS, remote_block_ids: many }))).toBe(true)
    const { do_remote_decode: _d, ...without } = P_PARAMS
    expect(Result.isSuccess(validateKvTransferParams(without))).toBe(true)
    // what Python's truth test reads as false: no remote decode to vLLM
    for (const v of [false, 0, "", null, [], {}])
      expect(Result.isSuccess(validateKvTransferParams({ ...P_PARAMS, do_remote_decode: v })), JSON.stringify(v)).toBe(
        true
      )
  })

  it("accepts params without remote_request_id (vLLM before PR #29665 neither sends nor reads it)", () => {
    const older = (({ remote_request_id: _r, ...rest }) => rest)(P_PARAMS)
    expect(success(validateKvTransferParams(older))).toStrictEqual(older)
    expect(success(extractKvTransferParams({ choices: [], kv_transfer_params: older }))).toStrictEqual(older)
  })

  it("accepts block lists per KV-cache group", () => {
    expect(Result.isSuccess(validateKvTransferParams({ ...P_PARAMS, remote_block_ids: [[], [7]] }))).toBe(true)
  })

  it("the decode body is the client's body with the parameters inserted verbatim", () => {
    const body = { prompt: "p", max_tokens: 50 }
    expect(success(kvTransferDecodeBody(body, P_PARAMS))).toStrictEqual({ ...body, kv_transfer_params: P_PARAMS })
    expect(failure(kvTransferDecodeBody(body, { ...P_PARAMS, remote_block_ids: [] })).missing).toStrictEqual([
      "remote_block_ids"
    ])
  })
})

describe("SGLang bootstrap", () => {
  const ok: BootstrapInput = { host: "10.0.0.7", port: 8998, room: 42 }

  it.each<[string, BootstrapInput, bigint]>([
    ["room 0", { ...ok, room: 0 }, 0n],
    ["room as a safe number", ok, 42n],
    ["room 2^63-1 as bigint", { ...ok, room: 2n ** 63n - 1n }, 2n ** 63n - 1n],
    ["room 2^63-1 as a decimal string", { ...ok, room: "9223372036854775807" }, 2n ** 63n - 1n],
    ["an IPv4 host", { ...ok, host: "10.0.0.7" }, 42n],
    ["a bare IPv6 host", { ...ok, host: "fd00::7" }, 42n],
    ["a bracketed IPv6 host", { ...ok, host: "[fd00::7]" }, 42n],
    ["a fully qualified host name", { ...ok, host: "prefill-0.pd.svc.cluster.local." }, 42n]
  ])("accepts %s", (_name, input, room) => {
    expect(success(validateBootstrap(input))).toStrictEqual({ host: input.host, port: input.port, room })
  })

  it.each<[string, BootstrapInput | undefined, string]>([
    ["no bootstrap", undefined, "bootstrap"],
    ["empty host", { ...ok, host: "" }, "bootstrap.host"],
    ["port 0 (unset in proto)", { ...ok, port: 0 }, "bootstrap.port"],
    ["port 70000", { ...ok, port: 70000 }, "bootstrap.port must be in 1..65535"],
    ["room 2^63", { ...ok, room: 2n ** 63n }, "bootstrap.room"],
    ["negative room", { ...ok, room: -1 }, "bootstrap.room"],
    ["fractional room", { ...ok, room: 1.5 }, "bootstrap.room"],
    ["room above 2^53 as a float (not exact)", { ...ok, room: 2 ** 60 }, "bootstrap.room"],
    ["room text that is not a number", { ...ok, room: "12ab" }, "bootstrap.room"],
    [
      "a host with CR/LF and an escape",
      { ...ok, host: "10.0.0.7\r\nevil\u001b[2J" },
      'bootstrap.host must be a host name or IP address, got "10.0.0.7\\r\\nevil\\u001b[2J"'
    ],
    ["a host with a port", { ...ok, host: "p-host:8998" }, "bootstrap.host must be a host name or IP address"],
    ["a host with a path", { ...ok, host: "p-host/route" }, "bootstrap.host must be a host name or IP address"],
    ["a host with spaces around it", { ...ok, host: " p-host " }, "bootstrap.host must be a host name or IP address"],
    ["an IPv4 literal out of range", { ...ok, host: "10.0.0.300" }, "bootstrap.host must be a host name or IP"],
    ["brackets around no IPv6", { ...ok, host: "[p-host]" }, "bootstrap.host must be a host name or IP address"]
  ])("refuses %s", (_name, input, mention) => {
    expect(failure(validateBootstrap(input)).message).toContain(mention)
  })

  it("both legs get the three fields; large rooms stay exact in JSON", () => {
    const b = success(validateBootstrap({ host: "p-host", port: 8998, room: 2n ** 63n - 1n }))
    const body = { prompt: "p", max_tokens: 4 }
    const leg = bootstrapLegBody(body, b)
    expect(JSON.parse(JSON.stringify(leg).replace("9223372036854775807", '"R"'))).toStrictEqual({
      ...body,
      bootstrap_host: "p-host",
      bootstrap_port: 8998,
      bootstrap_room: "R"
    })
    expect(JSON.stringify(leg)).toBe(
      '{"prompt":"p","max_tokens":4,"bootstrap_host":"p-host","bootstrap_port":8998,"bootstrap_room":9223372036854775807}'
    )
    const small = bootstrapLegBody(body, success(validateBootstrap({ host: "h", port: 1, room: 7 })))
    expect(small.bootstrap_room).toBe(7)
  })
})

describe("planLeg", () => {
  const body = { prompt: "p", max_tokens: 8 }
  const bootstrap = { host: "h", port: 8998, room: 1 }

  const kvPrefill = { _tag: "Prefill", protocol: "kv_transfer_params" }
  it.each<[string, Parameters<typeof planLeg>[0], { _tag: string; protocol?: string }]>([
    ["both over kv_transfer_params", { role: "both", handoff: "kv_transfer_params", body }, { _tag: "Normal" }],
    ["both without a handoff", { role: "both", handoff: undefined, body }, { _tag: "Normal" }],
    ["prefill over kv_transfer_params", { role: "prefill", handoff: "kv_transfer_params", body }, kvPrefill],
    [
      "prefill with a router's own params (vLLM's proxy sends do_remote_decode), which the agent's replace",
      { role: "prefill", handoff: "kv_transfer_params", body, kvTransferParams: { do_remote_decode: true } },
      kvPrefill
    ],
    [
      // what vLLM's toy proxy really sends a prefill server: do_remote_prefill false beside do_remote_decode true (only
      // a decode leg's, do_remote_prefill true, is refused on a prefill node)
      "prefill with the proxy's whole params (do_remote_prefill: false), which the agent's replace",
      {
        role: "prefill",
        handoff: "kv_transfer_params",
        body,
        kvTransferParams: { ...VLLM_PREFILL_KV_TRANSFER_PARAMS }
      },
      kvPrefill
    ],
    [
      "decode over kv_transfer_params",
      { role: "decode", handoff: "kv_transfer_params", body, kvTransferParams: P_PARAMS },
      { _tag: "Decode", protocol: "kv_transfer_params" }
    ],
    [
      "prefill over bootstrap",
      { role: "prefill", handoff: "bootstrap", body, bootstrap },
      { _tag: "Prefill", protocol: "bootstrap" }
    ],
    [
      "decode over bootstrap",
      { role: "decode", handoff: "bootstrap", body, bootstrap },
      { _tag: "Decode", protocol: "bootstrap" }
    ]
  ])("%s", (_name, input, leg) => {
    expect(success(planLeg(input))).toMatchObject(leg)
  })

  it.each<[string, Parameters<typeof planLeg>[0], string]>([
    ["decode without params", { role: "decode", handoff: "kv_transfer_params", body }, "kv_transfer_params"],
    [
      "decode with bad params",
      { role: "decode", handoff: "kv_transfer_params", body, kvTransferParams: {} },
      "remote_host"
    ],
    ["a bootstrap leg without bootstrap", { role: "prefill", handoff: "bootstrap", body }, "bootstrap"],
    ["prefill on an engine without a handoff", { role: "prefill", handoff: undefined, body }, "has none"],
    [
      "a decode leg's params on a prefill node",
      { role: "prefill", handoff: "kv_transfer_params", body, kvTransferParams: P_PARAMS },
      "send this leg to a decode node"
    ],
    [
      "bootstrap on a kv_transfer_params node",
      { role: "decode", handoff: "kv_transfer_params", body, kvTransferParams: P_PARAMS, bootstrap },
      "bootstrap on a node whose engine hands off by kv_transfer_params"
    ],
    [
      "kv_transfer_params on a bootstrap node",
      { role: "prefill", handoff: "bootstrap", body, bootstrap, kvTransferParams: P_PARAMS },
      "kv_transfer_params on a node whose engine hands off by bootstrap"
    ]
  ])("refuses %s", (_name, input, mention) => {
    expect(failure(planLeg(input)).message).toContain(mention)
  })

  it("the planned bodies are the leg bodies; role both sends the client's body unchanged", () => {
    const prefill = success(planLeg({ role: "prefill", handoff: "kv_transfer_params", body }))
    expect(prefill.body).toStrictEqual(vllmPrefillBody(body))
    const leg = success(planLeg({ role: "prefill", handoff: "bootstrap", body, bootstrap }))
    expect(leg).toStrictEqual({
      _tag: "Prefill",
      protocol: "bootstrap",
      body: { ...body, bootstrap_host: "h", bootstrap_port: 8998, bootstrap_room: 1 }
    })
    const both = success(planLeg({ role: "both", handoff: "bootstrap", body, bootstrap, kvTransferParams: P_PARAMS }))
    expect(both.body).toBe(body)
  })
})
