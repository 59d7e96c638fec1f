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
   * The engine's usage, when it reports one. The agent has no tokenizer: without it the final message has no usage
   * rather than counts of the agent's making (it knows no prompt count, and a chunk is not a token).
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
          this.finishReason = fr
          // Read only on the finishing chunk: nothing per token. A token id there is no stop string.
          const stop = this.stopSequenceField === undefined ? undefined : c[this.stopSequenceField]
          if (typeof stop === "string") this.stopSequence = stop
        }
      }
    }
    const u = chunk.usage as Record<string, unknown> | null | undefined
    if (u !== undefined && u !== null) {
      const prompt = num(u.prompt_tokens)
      const completion = num(u.completion_tokens)
      this.usage = {
        promptTokens: prompt,
        completionTokens: completion,
        totalTokens: u.total_tokens === undefined ? prompt + completion : num(u.total_tokens)
      }
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

const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) && v >= 0 ? Math.floor(v) : 0)

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
