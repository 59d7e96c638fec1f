/**
 * The engine's answer read back into the gRPC contract (pure): ChunkReader turns OpenAI stream chunks into
 * text, finish reason, usage and handoff parameters, and builds the final message; Coalescer merges the
 * text that arrives while the caller is not reading into one pending delta. The relay
 * (layers/grpc/Relay.ts) runs one of each per call.
 */
import type { GenerateFinal, Usage } from "../../gen/cgn/agent/v1/agent.ts"
import type { JsonObject } from "../engine/EngineClient.ts"

/**
 * Reads one request's OpenAI stream chunks: the text of each, the finish reason and usage when they
 * come. Chat chunks carry `choices[].delta.content`, completion chunks `choices[].text`; the usage
 * chunk has `choices: []`. A mutable object because it runs once per engine token.
 */
export class ChunkReader {
  finishReason = ""
  /** The stop string the engine named when it finished (the backend's `stopSequenceField`), else "". */
  stopSequence = ""
  /**
   * The engine's usage, when it reports one whose counts fit their uint32 fields. The agent has no tokenizer: without
   * it the final message has no usage rather than counts of the agent's making (it knows no prompt count, and a chunk
   * is not a token).
   */
  usage: Usage | undefined = undefined
  /**
   * The handoff parameters of a vLLM prefill leg, validated and set by that leg (layers/grpc/EngineLegs.ts, through
   * Handoff.extractKvTransferParams); `read` never takes them from a chunk, so a streamed answer cannot put
   * unchecked engine fields into the final message.
   */
  kvTransferParams: Record<string, unknown> | undefined = undefined

  /** Where the engine names the stop string that ended a choice (Engine.ts capabilities), if it does. */
  private readonly stopSequenceField: string | undefined
  constructor(stopSequenceField?: string) {
    this.stopSequenceField = stopSequenceField
  }

  /** The text this chunk adds ("" for none). */
  read(chunk: JsonObject): string {
    let text = ""
    // Junk in place of the choices, a choice or a delta (null, a number) carries no text; it must not throw here
    // (`!= null` is all it takes: a property of any other value reads undefined).
    const choices = chunk.choices as ReadonlyArray<Record<string, unknown> | null> | null | undefined
    if (choices != null && choices.length > 0) {
      const c = choices[0]
      if (c != null) {
        const delta = c.delta as Record<string, unknown> | null | undefined
        const t = delta != null ? delta.content : c.text
        if (typeof t === "string") text = t
        const fr = c.finish_reason
        if (typeof fr === "string" && fr !== "") {
          this.finishReason = finishReasonOf(fr)
          // Read only on the finishing chunk: nothing per token. A token id there is no stop string.
          const stop = this.stopSequenceField === undefined ? undefined : c[this.stopSequenceField]
          if (typeof stop === "string") this.stopSequence = stop
        }
      }
    }
    const u = chunk.usage as Record<string, unknown> | null | undefined
    if (u !== undefined && u !== null) {
      const prompt = count(u.prompt_tokens)
      const completion = count(u.completion_tokens)
      const total = u.total_tokens === undefined ? prompt + completion : count(u.total_tokens)
      // A count past uint32 is none the engine could have made (and its encoding threw, leaving the call open): the
      // usage is dropped whole, as from an engine that reports none (cgn_agent_finals_without_usage_total counts it).
      this.usage =
        total <= UINT32_MAX && prompt <= UINT32_MAX && completion <= UINT32_MAX
          ? { promptTokens: prompt, completionTokens: completion, totalTokens: total }
          : undefined
    }
    return text
  }

  /** The final message; no usage when the engine reported none. */
  final(info: {
    readonly ttftMs: number
    readonly totalMs: number
    readonly queueMs: number
    readonly nodeId: string
    readonly requestId: string
  }): GenerateFinal {
    const final: GenerateFinal = {
      finishReason: this.finishReason === "" ? "stop" : this.finishReason,
      usage: this.usage,
      timings: { timeToFirstTokenMs: info.ttftMs, totalMs: info.totalMs, queueMs: info.queueMs },
      nodeId: info.nodeId,
      requestId: info.requestId,
      stopSequence: this.stopSequence
    }
    if (this.kvTransferParams !== undefined) final.kvTransferParams = this.kvTransferParams
    return final
  }
}

/** The largest proto uint32 (Usage's counts). */
const UINT32_MAX = 0xffff_ffff

/**
 * One usage count: not a number, negative or NaN is 0, a fraction floored; one past UINT32_MAX (2^32, 1e300, a 1e400
 * that JSON.parse made Infinity) is kept as it is, for `read` to drop the usage.
 */
const count = (v: unknown): number => (typeof v === "number" && v >= 0 ? Math.floor(v) : 0)

/**
 * The longest finish reason kept. Upstream's are short words: vLLM's "stop", "length", "abort", "error",
 * "repetition" (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS), "tool_calls" on chat
 * (vllm/entrypoints/openai/serving_chat.py); SGLang's and llama-server's are among these too.
 */
export const MAX_FINISH_REASON_CHARS = 64

/**
 * The engine's finish reason as the final message carries it: at most MAX_FINISH_REASON_CHARS, printable ASCII (any
 * other character "?"). Unbounded, a hostile engine's 100,000 characters of control codes went to the caller, and one
 * near the SSE event limit (4 MiB) pushed the final past a grpc-js client's receive limit. Once per call.
 */
const finishReasonOf = (fr: string): string => {
  const cut = fr.length > MAX_FINISH_REASON_CHARS ? fr.slice(0, MAX_FINISH_REASON_CHARS) : fr
  return /^[\x20-\x7e]*$/.test(cut) ? cut : cut.replace(/[^\x20-\x7e]/g, "?")
}

/**
 * Merges text that arrives while the caller is not reading into one pending delta. After each network read the
 * relay asks `hasRoom`; without room the producer stops reading the engine until `take` makes room, so memory per
 * stream stays at most `maxPendingChars` plus one read's text.
 */
export class Coalescer {
  private text = ""
  private tokens = 0
  readonly maxPendingChars: number
  constructor(maxPendingChars: number) {
    this.maxPendingChars = maxPendingChars
  }
  get pendingChars(): number {
    return this.text.length
  }
  get hasRoom(): boolean {
    return this.text.length < this.maxPendingChars
  }
  /** Appends one chunk's text (one or more tokens). */
  push(text: string): void {
    this.text += text
    this.tokens++
  }
  /** Everything pending as one delta, or undefined when nothing is. */
  take(): { readonly text: string; readonly tokens: number } | undefined {
    if (this.tokens === 0) return undefined
    const out = { text: this.text, tokens: this.tokens }
    this.text = ""
    this.tokens = 0
    return out
  }
}
