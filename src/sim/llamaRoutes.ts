// llama-server's own informational routes, as the simulator's llama_cpp flavor answers them: GET /props and
// /slots, POST /tokenize, /detokenize and /apply-template (ggml-org/llama.cpp tools/server/server.cpp routes;
// tools/server/server-context.cpp get_res_props, server_slot::to_json, post_tokenize, post_detokenize,
// post_apply_template). Keys in llama-server's order; what only a real model has is the model file's where the
// simulator can read it (a llama SentencePiece vocabulary: llamaVocab.ts), else its stand-in: its word tokens
// (tokens.ts), and a ChatML template (llamaTemplate.ts). The POST routes a server without their flag refuses:
// llamaUnsupported.ts.
import { randomInt } from "node:crypto"
import type * as http from "node:http"
import { reply, type SimContext, sendError } from "./context.ts"
import { bareStatus, readJson } from "./jsonBody.ts"
import { LLAMA_FINGERPRINT } from "./llamaChunks.ts"
import { typeError } from "./llamaFields.ts"
import { llamaMessages } from "./llamaMessages.ts"
import { cppValue } from "./llamaNumbers.ts"
import { DEFAULT_PARAMS } from "./llamaSlots.ts"
import { CHAT_TEMPLATE } from "./llamaTemplate.ts"
import { unsupportedMessage } from "./llamaUnsupported.ts"
import { pieceBytes, pieceJson, utf8Text, vocabTokenize } from "./llamaVocab.ts"
import type { SpmVocab } from "./spmVocab.ts"
import { N_VOCAB, tokenId, words } from "./tokens.ts"

/** The simulated vocabulary's special tokens (llama SentencePiece's). */
const BOS = 1
const SPECIAL: ReadonlyMap<number, string> = new Map([
  [0, "<unk>"],
  [BOS, "<s>"],
  [2, "</s>"]
])

const ID_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
/** get_media_marker(): drawn once per process. */
const MEDIA_MARKER = `<__media_${Array.from({ length: 32 }, () => ID_CHARS[randomInt(ID_CHARS.length)]).join("")}__>`

/** The words the simulator has tokenized, so /detokenize can give them back (its ids are hashes). */
const seen = new Map<number, string>()

/** One text's tokens with their pieces: SentencePiece's, a space before each word. */
const tokenizeText = (text: string): Array<{ id: number; piece: string }> =>
  words(text).map((w) => {
    const id = tokenId(w)
    seen.set(id, w)
    return { id, piece: ` ${w}` }
  })

/** get<llama_token>(): a number or boolean as nlohmann converts it to an int32 (llamaNumbers.ts), else its error. */
const tokenOf = (v: unknown): number | string =>
  typeof v === "number" || typeof v === "boolean" ? (cppValue(v, "int32") as number) : typeError("number", v)

/** std::vector::at's refusal of an id outside the vocabulary: the id as the size_t it takes (-1 wraps). */
const rangeError = (id: number, size: number): string =>
  `vector::_M_range_check: __n (which is ${BigInt.asUintN(64, BigInt(id))}) >= this->size() (which is ${size})`

/**
 * An id's piece (common_token_to_piece) as bytes (one char each): the model's where it has a vocabulary
 * (llamaVocab.ts), else the simulator's word; an id outside the vocabulary is refused.
 */
const pieceOf = (id: number, vocab: SpmVocab | undefined): string | { readonly error: string } => {
  const size = vocab?.pieces.length ?? N_VOCAB
  if (id < 0 || id >= size) return { error: rangeError(id, size) }
  if (vocab !== undefined) return pieceBytes(vocab, id)
  return Buffer.from(SPECIAL.get(id) ?? ` ${seen.get(id) ?? ""}`, "utf8").toString("latin1")
}

type Token = number | { id: number; piece: string }

/**
 * tokenize_mixed: a string, or strings and token ids mixed, in order; add_special puts the BOS first only where the
 * first element is a string (a leading id clears it). A non-string element is read with get<llama_token>(). With the
 * model's vocabulary, its ids (parse_special: its control tokens split out of the text); else the simulator's words.
 */
const tokenize = (
  content: unknown,
  addSpecial: boolean,
  parseSpecial: boolean,
  vocab?: SpmVocab
): Array<Token> | string => {
  // anything but an array or a string fails get<std::string>() (nlohmann's words)
  if (!Array.isArray(content) && typeof content !== "string") return typeError("string", content)
  const parts = Array.isArray(content) ? content : [content]
  const out: Array<Token> = []
  if (vocab === undefined && addSpecial && typeof parts[0] === "string") out.push({ id: BOS, piece: "<s>" })
  for (const [i, p] of parts.entries()) {
    if (typeof p === "string") {
      out.push(...(vocab ? vocabTokenize(vocab, p, addSpecial && i === 0, parseSpecial) : tokenizeText(p)))
      continue
    }
    const id = tokenOf(p)
    if (typeof id === "string") return id
    out.push(id)
  }
  return out
}

const props = (ctx: SimContext, nCtx: number) => ({
  default_generation_settings: { params: DEFAULT_PARAMS, n_ctx: nCtx },
  total_slots: ctx.cfg.maxSeqs,
  model_alias: ctx.cfg.servedName,
  model_ftype: "(guessed) all F32",
  model_path: ctx.cfg.model,
  modalities: { vision: false, video: false, audio: false },
  media_marker: MEDIA_MARKER,
  endpoint_slots: true,
  endpoint_props: false,
  endpoint_metrics: ctx.cfg.enableMetrics,
  ui: true,
  ui_settings: {},
  chat_template: CHAT_TEMPLATE,
  chat_template_caps: {
    supports_object_arguments: false,
    supports_parallel_tool_calls: false,
    supports_preserve_reasoning: false,
    supports_reasoning_effort: false,
    supports_string_content: true,
    supports_system_role: true,
    supports_tool_calls: false,
    supports_tools: false,
    supports_typed_content: false
  },
  bos_token: "<s>",
  eos_token: "</s>",
  build_info: LLAMA_FINGERPRINT,
  is_sleeping: false,
  cors_proxy_enabled: false
})

/** GET /props and /slots: their bodies; undefined for another path. */
const getRoute = (ctx: SimContext, path: string, query: string, res: http.ServerResponse): boolean => {
  if (path !== "/props" && path !== "/slots") return false
  // a slot's context (n_ctx_slot); get_slots answers 503 to a non-empty `fail_on_no_slot` while no slot is idle
  const [nCtx, busy, n] = [ctx.cfg.slotContext ?? 4096, ctx.engines.running, ctx.cfg.maxSeqs]
  const rank = ctx.engines.ranks[0]
  // a GET /slots is a task of the server's (SLOT_GET), a refused one too: it takes an id (llamaSlots.ts)
  if (path === "/slots") rank?.slotBook.taskId()
  if (path === "/slots" && busy >= n && new URLSearchParams(query).get("fail_on_no_slot")) {
    sendError(ctx, res, 503, "no slot available")
    return true
  }
  const slot = (id: number) => rank?.slotBook.toJson(id, nCtx, rank.scheduler.busy(id))
  reply(ctx, res, 200, path === "/props" ? props(ctx, nCtx) : Array.from({ length: n }, (_, id) => slot(id)))
  return true
}

/** The answer of a POST route to a parsed body: [status, body] or an error's [status, message]. */
const postAnswer = (
  path: string,
  body: Record<string, unknown>,
  vocab: SpmVocab | undefined
): [number, unknown] | [number, string, true] => {
  if (path === "/tokenize") {
    if (!("content" in body)) return [200, { tokens: [] }]
    // json_value: a value of another type than the default's is the default
    const toks = tokenize(body.content, body.add_special === true, body.parse_special !== false, vocab)
    if (typeof toks === "string") return [500, toks, true]
    if (body.with_pieces !== true) return [200, { tokens: toks.map((t) => (typeof t === "number" ? t : t.id)) }]
    const pieces: Array<{ id: number; piece: string | Array<number> }> = []
    for (const t of toks) {
      const piece = typeof t === "number" ? pieceOf(t, vocab) : t.piece
      if (typeof piece !== "string") return [500, piece.error, true]
      pieces.push(typeof t === "number" ? { id: t, piece: vocab ? pieceJson(piece) : utf8Text(piece) } : t)
    }
    return [200, { tokens: pieces }]
  }
  if (path === "/detokenize") {
    // get<llama_tokens>(): an array (null is no array), every element converted before any is looked up
    if (!("tokens" in body)) return [200, { content: "" }]
    if (!Array.isArray(body.tokens)) return [500, typeError("array", body.tokens), true]
    const ids = (body.tokens as Array<unknown>).map(tokenOf)
    const bad = ids.find((i) => typeof i === "string")
    if (bad !== undefined) return [500, bad, true]
    const pieces = (ids as Array<number>).map((id) => pieceOf(id, vocab))
    const out = pieces.find((p) => typeof p !== "string")
    if (out !== undefined) return [500, (out as { error: string }).error, true]
    return [200, { content: utf8Text(pieces.join("")) }]
  }
  // /apply-template: the chat's checks (oaicompat_chat_params_parse), then its rendering (llamaTemplate.ts)
  const checked = llamaMessages(body)
  if ("status" in checked) return [checked.status, checked.message, true]
  return [200, { prompt: checked.text }]
}

const POST_ROUTES = new Set(["/tokenize", "/detokenize", "/apply-template"])

/** Answers one of these routes (true), or leaves the request to the caller (false). */
export const llamaRoute = (
  ctx: SimContext,
  method: string | undefined,
  path: string,
  query: string,
  req: http.IncomingMessage,
  res: http.ServerResponse
): boolean => {
  if (method === "GET") return getRoute(ctx, path, query, res)
  // a route this server would refuse 501 whatever the body (llamaUnsupported.ts): flags on the simulator's own
  // command line, which is the engine's
  const enabled = (n: string) => (n.startsWith("LLAMA_ARG_") ? process.env[n] !== undefined : process.argv.includes(n))
  const unsupported = method === "POST" ? unsupportedMessage(path, enabled) : undefined
  if (unsupported !== undefined) {
    req.resume()
    sendError(ctx, res, 501, unsupported)
    return true
  }
  if (method !== "POST" || !POST_ROUTES.has(path)) return false
  void readJson("llama_cpp", req).then((read) => {
    if ("bare" in read) return bareStatus(res, read.bare)
    if ("message" in read) return sendError(ctx, res, read.status, read.message)
    const { body } = read
    const b = typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : {}
    const [status, out, failed] = postAnswer(path, b, ctx.cfg.vocab)
    if (failed === true) return sendError(ctx, res, status, out as string)
    reply(ctx, res, status, out)
  })
  return true
}
