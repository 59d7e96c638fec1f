// POST /tokenize's and /detokenize's tokens where the model file has a llama SentencePiece vocabulary (spmVocab.ts),
// as llama-server makes them (pure): the model's own ids and pieces, not the simulator's word ids. Sources
// (ggml-org/llama.cpp): tools/server/server-context.cpp post_tokenize (add_special false, parse_special true and
// with_pieces false by default, each read with json_value: a value of another type is the default; a piece that is
// not valid UTF-8 as its bytes), tools/server/server-common.cpp tokenize_mixed and tokens_to_str, src/llama-vocab.cpp
// token_to_piece (SPM: a normal token's text with U+2581 as a space, a byte token's byte, a control, unknown or
// user-defined token's text as it is, an unused one nothing). Measured against the real binary
// (test/real/sim-differential-13.test.ts): before this the simulator answered its word ids ("  hello" one token).
import { type SpmVocab, spmTokenize } from "./spmVocab.ts"

/** A token's piece as bytes (one char each, latin1), as common_token_to_piece makes it (special tokens shown). */
export const pieceBytes = (v: SpmVocab, id: number): string => {
  const text = Buffer.from(v.pieces[id] ?? "", "utf8").toString("latin1")
  switch (v.types[id]) {
    case 1:
      return text.replaceAll("\u00e2\u0096\u0081", " ")
    case 2:
    case 3:
    case 4:
      return text
    case 6:
      return String.fromCharCode(Number.parseInt(text.slice(3, 5), 16))
    default:
      return ""
  }
}

/** Bytes (latin1) as text; what is not UTF-8 becomes U+FFFD, as the server's JSON dump replaces it. */
export const utf8Text = (b: string): string => Buffer.from(b, "latin1").toString("utf8")

/** with_pieces' piece: the text where its bytes are valid UTF-8, else the bytes as numbers (is_valid_utf8). */
export const pieceJson = (b: string): string | Array<number> => {
  const buf = Buffer.from(b, "latin1")
  const text = buf.toString("utf8")
  return Buffer.from(text, "utf8").equals(buf) ? text : [...buf]
}

/** One text of /tokenize's content: its ids (common_tokenize), the BOS first where `addSpecial`. */
export const vocabTokenize = (v: SpmVocab, text: string, addSpecial: boolean, parseSpecial: boolean): Array<number> =>
  spmTokenize(v, text, addSpecial, parseSpecial)
