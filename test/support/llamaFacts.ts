// What the real llama-server was measured to answer (test/real/sim-differential-6.test.ts sends these to both it and
// the simulator; test/sim/llama-grammar-pins.test.ts holds the simulator's pure checks to them without the binary).

/** Grammars llama-grammar.cpp parses: rule names [a-zA-Z0-9-], the class escapes, a C string up to its NUL. */
export const GRAMMARS_TAKEN = [
  ['root ::= my-x\nmy-x ::= "a"', "a rule name with a dash"],
  ["root ::= [\\[\\]\\-]", "the escapes \\[ \\] \\- in a class"],
  ['root ::= "a"\u0000garbage', "junk after a NUL (the C string's end)"],
  ['root ::= "a"{1999}', "1999 repetitions"]
] as const

/** Grammars it refuses: no newline between a rule's name and ::=, a token closed by '>', junk after alternates. */
export const GRAMMARS_REFUSED = [
  ['root\n::= "a"', "a newline between the rule's name and ::="],
  ["root ::= <[5]", "a token id without its closing '>'"],
  ["root ::= <abc", "a token text without its closing '>'"],
  ['root ::= "a" )', "junk after a rule's alternates"]
] as const

/** json-schema-to-grammar.cpp PRIMITIVE_RULES' names: each a `type` the converter takes. */
export const JSON_SCHEMA_PRIMITIVE_TYPES = [
  "boolean",
  "decimal-part",
  "integral-part",
  "number",
  "integer",
  "value",
  "object",
  "array",
  "uuid",
  "char",
  "string",
  "null"
] as const
