// The edges of the engines' refusals as src/sim/upstreamRefusals.ts words them, which the served tests
// (upstream-refusals.test.ts) do not reach, each from the upstream source it cites:
// - FastAPI: a JSON null body is no body (`missing`), another non-object pydantic's model_attributes_type;
// - SGLang's ChatCompletionMessageGenericParam normalises the role's case (protocol.py _normalize_role);
// - SGLang's _validate_request (serving_chat.py, serving_completions.py): `max_completion_tokens or max_tokens`
//   (Python's `or`: a 0 falls through) refused only beyond --context-length; an empty prompt list is "None"; the
//   first blank string's index; only negative token ids;
// - vLLM (vllm/entrypoints/openai/protocol.py ChatCompletionRequest.to_sampling_params): a chat's top_logprobs are
//   asked for only when `logprobs` is true; check_logprobs (completion/protocol.py, chat_completion/protocol.py)
//   takes 0 and -1, refusing only what is below 0 otherwise.
import { describe, expect, it } from "vitest"
import type { SimConfig } from "../../src/sim/simConfig.ts"
import {
  notAnObject,
  sglangRequestRefusal,
  sglangRoleRefusal,
  vllmBuiltRefusal,
  vllmLogprobsRefusal
} from "../../src/sim/upstreamRefusals.ts"

const cfg = { maxModelLen: 100 } as SimConfig
const chat = (b: Record<string, unknown>) =>
  sglangRequestRefusal(cfg, "chat", { messages: [{ role: "user", content: "hi" }], ...b })
const completion = (prompt: unknown) => sglangRequestRefusal(cfg, "completion", { prompt })

describe("FastAPI's body that is not an object", () => {
  it("JSON null is a missing body; a number is not a dictionary", () => {
    expect(notAnObject("vllm", null).message).toBe("Field required")
    expect(notAnObject("sglang", 5).message).toBe("Input should be a valid dictionary or object to extract fields from")
  })
})

describe("SGLang", () => {
  it("takes a role in any case; refuses one neither message model takes", () => {
    expect(sglangRoleRefusal({ messages: [{ role: "System", content: "x" }] })).toBeUndefined()
    expect(sglangRoleRefusal({ messages: [{ role: "ASSISTANT", content: "x" }] })).toBeUndefined()
    expect(sglangRoleRefusal({ messages: [{ role: "narrator", content: "x" }] })?.status).toBe(400)
  })

  it("max_tokens counts when max_completion_tokens is absent or 0; the context length itself is allowed", () => {
    const tooLarge = (n: number) =>
      `max_completion_tokens is too large: ${n}.This model supports at most 100 completion tokens.`
    expect(chat({ max_tokens: 101 })).toBe(tooLarge(101))
    expect(chat({ max_completion_tokens: 0, max_tokens: 150 })).toBe(tooLarge(150))
    expect(chat({ max_completion_tokens: 100 })).toBeUndefined()
    expect(chat({ max_tokens: 100 })).toBeUndefined()
  })

  it("a prompt: an empty list is None, the first blank string by its index, only negative token ids", () => {
    expect(completion([])).toBe("Prompt cannot be None")
    expect(completion(["  ", "a"])).toBe("Prompt at index 0 cannot be empty or whitespace only")
    expect(completion(["a", "\t"])).toBe("Prompt at index 1 cannot be empty or whitespace only")
    expect(completion([0, 1, 2])).toBeUndefined()
    expect(completion([3, -1])).toBe("Token IDs must be non-negative")
  })
})

describe("vLLM's built sampling params", () => {
  it("a chat's top_logprobs beyond the bound count only with logprobs true", () => {
    expect(vllmBuiltRefusal("chat", { top_logprobs: 30 })).toBeUndefined()
    expect(vllmBuiltRefusal("chat", { logprobs: false, top_logprobs: 30 })).toBeUndefined()
    expect(vllmBuiltRefusal("chat", { logprobs: true, top_logprobs: 30 })?.param).toBe("logprobs")
    expect(vllmBuiltRefusal("chat", { logprobs: true, top_logprobs: 20 })).toBeUndefined()
  })

  it("check_logprobs takes 0 and -1; below that it refuses, naming the field", () => {
    expect(vllmLogprobsRefusal("completion", { logprobs: 0 })).toBeUndefined()
    expect(vllmLogprobsRefusal("chat", { top_logprobs: 0 })).toBeUndefined()
    expect(vllmLogprobsRefusal("completion", { logprobs: -1 })).toBeUndefined()
    expect(vllmLogprobsRefusal("completion", { logprobs: -2 })?.param).toBe("logprobs")
    expect(vllmLogprobsRefusal("chat", { top_logprobs: -2 })?.param).toBe("top_logprobs")
  })
})
