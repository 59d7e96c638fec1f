// Stop strings (pure), per engine: how vLLM, SGLang and mlx-lm find a request's `stop` in the text a sequence
// generates a token at a time, where they cut the text, what a stream sends meanwhile, and what the finished
// choice says about the stop. llama-server's rule is sequences.ts's. The engines differ in every one of these,
// so each is its own small matcher behind one interface.
import type { Flavor } from "./simConfig.ts"

/** What a matcher is told about the token it is given. */
export interface TokenAt {
  /** The plan's last token: the sequence ends after it unless a stop string ends it here. */
  readonly last: boolean
  /** The plan ends with the end-of-sequence token right after this one. */
  readonly eos: boolean
  /** This token is the max_tokens-th (the plan ends with "length" here). */
  readonly cap: boolean
}

export interface StopStep {
  /** The text the stream sends for this token now ("" while the engine holds it back). */
  readonly send: string
  /** The stop string that ended the sequence at this token. */
  readonly matched?: string | undefined
}

/** One sequence's text, fed one token at a time. */
export interface StopMatcher {
  add(piece: string, at: TokenAt): StopStep
  /** The text a non-streamed answer carries: everything generated, cut as the engine cuts it. */
  readonly text: string
  /** Text still held back when the sequence ends: the engine sends it with the finish. */
  rest(): string
  /** Generated tokens the engine leaves out of its usage (mlx-lm drops the stop's tokens). */
  readonly uncounted: number
}

/** The stop-related request fields. */
export interface StopRequest {
  readonly stop: ReadonlyArray<string>
  /** vLLM `include_stop_str_in_output`. */
  readonly includeStopStr?: boolean | undefined
  /** SGLang `no_stop_trim`. */
  readonly noStopTrim?: boolean | undefined
}

/**
 * The end-of-sequence token id the simulator's vocabulary (ids below 32000, tokens.ts tokenId) has: Llama-2's
 * `</s>`. SGLang names it as `matched_stop` when a sequence ends on it (schedule_batch.py FINISH_MATCHED_TOKEN).
 */
export const SIM_EOS_TOKEN_ID = 2

/**
 * vLLM (vllm-project/vllm vllm/v1/engine/detokenizer.py, BaseIncrementalDetokenizer.update and
 * check_stop_strings; vllm/v1/engine/output_processor.py). After each token the stop strings are tried in list
 * order, each searched from `1 - new_chars - len(stop)` chars before the end (so it ends in the new text); the
 * first found wins: `stop_reason` is that string and the text is cut before it, or after it with
 * include_stop_str_in_output. The check runs whatever the engine core said, so a stop string on the
 * max_tokens-th token turns "length" into "stop". A stream sends `output_text[sent : len - (longest stop - 1)]`
 * per token (get_next_output_text; a chunk goes out for every token, its text possibly ""), the rest once the
 * sequence is finished.
 */
class VllmStops implements StopMatcher {
  text = ""
  readonly uncounted = 0
  private sent = 0
  private readonly hold: number
  private readonly req: StopRequest
  constructor(req: StopRequest) {
    this.req = req
    const longest = Math.max(0, ...req.stop.map((s) => s.length))
    this.hold = req.stop.length > 0 && req.includeStopStr !== true ? longest - 1 : 0
  }
  add(piece: string, at: TokenAt): StopStep {
    this.text += piece
    let matched: string | undefined
    if (piece.length > 0) {
      for (const s of this.req.stop) {
        const found = this.text.indexOf(s, Math.max(0, this.text.length - piece.length - s.length + 1))
        if (found < 0) continue
        matched = s
        const end = found + s.length
        if (this.req.includeStopStr !== true) this.text = this.text.slice(0, found)
        else if (end < this.text.length) this.text = this.text.slice(0, end)
        break
      }
    }
    const upTo = matched !== undefined || at.last ? this.text.length : this.text.length - this.hold
    if (upTo <= this.sent) return { send: "", matched }
    const send = this.text.slice(this.sent, upTo)
    this.sent = upTo
    return { send, matched }
  }
  rest(): string {
    return ""
  }
}

/**
 * SGLang (sgl-project/sglang python/sglang/srt/managers/schedule_batch.py Req.check_finished and
 * _check_str_based_finish; detokenizer_manager.py trim_matched_stop). "length" is checked first: on the
 * max_tokens-th token no stop string is looked for. Otherwise the first stop of the list found in the text ends
 * the sequence (FINISH_MATCHED_STR, `matched_stop`), and the text is cut where that stop first occurs unless
 * no_stop_trim. Nothing is held back: each token's text is sent as decoded, and the finishing output is the cut
 * text past what was sent (`output_str[sent_offset:]`), so the part of a stop that began in an earlier token
 * stays streamed.
 */
class SglangStops implements StopMatcher {
  text = ""
  readonly uncounted = 0
  private sent = 0
  private readonly req: StopRequest
  constructor(req: StopRequest) {
    this.req = req
  }
  add(piece: string, at: TokenAt): StopStep {
    this.text += piece
    const matched = at.cap ? undefined : this.req.stop.find((s) => this.text.includes(s))
    // trim_matched_stop trims nothing for a falsy match (an empty stop string, which ends the sequence at once).
    if (matched && this.req.noStopTrim !== true) this.text = this.text.slice(0, this.text.indexOf(matched))
    const send = this.text.slice(this.sent)
    this.sent = Math.max(this.sent, this.text.length)
    return { send, matched }
  }
  rest(): string {
    return ""
  }
}

/**
 * How the simulator tokenizes a stop string for mlx-lm, the way its own tokens are made (tokens.ts: a word with
 * the whitespace before it): " three four" is [" three", " four"], "three" is ["three"], which no token after
 * the first equals.
 */
export const simTokens = (text: string): Array<string> => text.match(/\s*\S+|\s+/g) ?? []

/** mlx_lm/server.py sequence_overlap: a suffix of `tokens` is a prefix of `stop`. */
const overlaps = (tokens: ReadonlyArray<string>, stop: ReadonlyArray<string>): boolean => {
  for (let i = 1; i <= Math.min(tokens.length, stop.length); i++) {
    if (stop.slice(0, i).every((t, j) => t === tokens[tokens.length - i + j])) return true
  }
  return false
}

/**
 * mlx-lm (ml-explore/mlx-lm mlx_lm/server.py, handle_completion with stopping_criteria and sequence_overlap).
 * Each stop string is tokenized (`tokenizer.encode(stop, add_special_tokens=False)`) and matches when the
 * generated token ids end with it, first of the list first: the text loses the stop's characters and the token
 * list (hence usage) its tokens. A stream sends the text gathered since its last chunk unless the tokens end
 * with the start of a stop; a completed stop drops what was held, and the end of sequence drops it too (its
 * own stop condition clears the segment); at max_tokens the finish chunk carries it.
 */
class MlxStops implements StopMatcher {
  text = ""
  uncounted = 0
  private readonly tokens: Array<string> = []
  private segment = ""
  private readonly seqs: ReadonlyArray<ReadonlyArray<string>>
  private readonly req: StopRequest
  constructor(req: StopRequest) {
    this.req = req
    this.seqs = req.stop.map(simTokens)
  }
  add(piece: string, at: TokenAt): StopStep {
    this.tokens.push(piece)
    this.text += piece
    this.segment += piece
    for (const [i, seq] of this.seqs.entries()) {
      const n = seq.length
      if (n === 0 || this.tokens.length < n) continue
      if (!seq.every((t, j) => t === this.tokens[this.tokens.length - n + j])) continue
      const word = this.req.stop[i] ?? ""
      this.uncounted = n
      this.text = this.text.slice(0, this.text.length - word.length)
      this.segment = ""
      return { send: "", matched: word }
    }
    if (this.seqs.some((seq) => overlaps(this.tokens, seq))) {
      if (at.eos) this.segment = ""
      return { send: "" }
    }
    const send = this.segment
    this.segment = ""
    return { send }
  }
  rest(): string {
    return this.segment
  }
}

/** The matcher of a flavor other than llama_cpp (sequences.ts has llama-server's). */
export const stopMatcher = (flavor: Exclude<Flavor, "llama_cpp">, req: StopRequest): StopMatcher => {
  switch (flavor) {
    case "vllm":
      return new VllmStops(req)
    case "sglang":
      return new SglangStops(req)
    case "mlx":
      return new MlxStops(req)
  }
}
