// The stall watchdog's test completion per engine kind and role (layers/engine/stallProbe.ts, its shape from
// Engine.capabilities): an SGLang prefill or decode server refuses a request without its bootstrap fields, so there
// the probe names SGLang's fake bootstrap host and a room, no port, as SGLang's own warm-up and /health_generate do
// (python/sglang/srt/entrypoints/http_server.py; FAKE_BOOTSTRAP_HOST, python/sglang/srt/disaggregation/utils.py).
// vLLM's NixlConnector serves a request without kv_transfer_params locally on either role
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py): plain there, as on every engine in role "both".
import { describe, expect, it } from "vitest"
import { PROBE_TOKENS, probeBody, probeShape } from "../../src/layers/engine/stallProbe.ts"
import { EngineKinds, Roles } from "../../src/services/config/ConfigSchema.ts"

const plain = { prompt: "ping", max_tokens: PROBE_TOKENS, temperature: 0 }
const fake = { bootstrap_host: "2.2.2.2", bootstrap_room: 0 }

describe("the stall probe's request", () => {
  it.each(["prefill", "decode"] as const)(
    "SGLang %s: the fake bootstrap host and room 0, on both endpoints",
    (role) => {
      const shape = probeShape("sglang", role)
      expect(probeBody("/v1/completions", shape)).toEqual({ ...plain, ignore_eos: true, ...fake })
      expect(probeBody("/v1/chat/completions", shape)).toEqual({
        messages: [{ role: "user", content: "ping" }],
        max_tokens: PROBE_TOKENS,
        temperature: 0,
        ignore_eos: true,
        ...fake
      })
      // no port: SGLang's own sends none (the fake sender and receiver never connect)
      expect(probeBody("/v1/completions", shape)).not.toHaveProperty("bootstrap_port")
    }
  )

  it("SGLang in role both, and vLLM in every role: no bootstrap fields", () => {
    expect(probeBody("/v1/completions", probeShape("sglang", "both"))).toEqual({ ...plain, ignore_eos: true })
    for (const role of Roles) {
      expect(probeBody("/v1/completions", probeShape("vllm", role))).toEqual({ ...plain, ignore_eos: true })
    }
  })

  it("of all engines and roles, only SGLang prefill and decode carry P/D fields", () => {
    for (const kind of EngineKinds) {
      for (const role of Roles) {
        const body = probeBody("/v1/completions", probeShape(kind, role))
        const pd = kind === "sglang" && role !== "both"
        expect("bootstrap_host" in body, `${kind} ${role}`).toBe(pd)
        expect("kv_transfer_params" in body, `${kind} ${role}`).toBe(false)
      }
    }
  })

  it.each(["prefill", "decode"] as const)(
    "SGLang %s with dp > 1: one request per rank, room r and routed_dp_rank r (a prefill server also routes room r to rank r mod dp)",
    (role) => {
      const shape = probeShape("sglang", role, 3)
      expect(shape.requests).toEqual(
        [0, 1, 2].map((r) => ({
          fields: { bootstrap_host: "2.2.2.2", bootstrap_room: r, routed_dp_rank: r },
          rank: r
        }))
      )
      expect(probeBody("/v1/completions", shape, shape.requests[2]?.fields)).toEqual({
        ...plain,
        ignore_eos: true,
        bootstrap_host: "2.2.2.2",
        bootstrap_room: 2,
        routed_dp_rank: 2
      })
    }
  )

  it("SGLang without P/D and dp > 1: one request per rank, named by routed_dp_rank alone", () => {
    const shape = probeShape("sglang", "both", 3)
    expect(shape.requests).toEqual([0, 1, 2].map((r) => ({ fields: { routed_dp_rank: r }, rank: r })))
    expect(probeBody("/v1/chat/completions", shape, shape.requests[1]?.fields)).toEqual({
      messages: [{ role: "user", content: "ping" }],
      max_tokens: PROBE_TOKENS,
      temperature: 0,
      ignore_eos: true,
      routed_dp_rank: 1
    })
    // one rank: no field (SGLang ignores rank 0 there, and refuses any other)
    expect(probeShape("sglang", "both", 1).requests).toEqual([{ fields: {} }])
    // neither a rank field nor a rank header: one request whatever dp
    expect(probeShape("llama_cpp", "both", 3).requests).toEqual([{ fields: {} }])
  })

  it("vLLM with dp > 1: one request per rank, pinned by the X-data-parallel-rank header, plain body", () => {
    for (const role of Roles) {
      expect(probeShape("vllm", role, 2).requests).toEqual([
        { fields: {}, rank: 0 },
        { fields: {}, rank: 1 }
      ])
      expect(probeShape("vllm", role, 1).requests).toEqual([{ fields: {} }])
    }
  })
})
