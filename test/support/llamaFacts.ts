// What the real llama-server was measured to answer (test/real/sim-differential-6.test.ts sends these to both it and
// the simulator; test/sim/llama-grammar-pins.test.ts holds the simulator's pure checks to them without the binary).

/** Grammars llama-grammar.cpp parses: rule names [a-zA-Z0-9-], the class escapes, a C string up to its NUL. */
export const GRAMMARS_TAKEN = [
  ['root ::= my-x\nmy-x ::= "a"', "a rule name with a dash"],
  ["root ::= [\\[\\]\\-]", "the escapes \\[ \\] \\- in a class"],
  ['root ::= "a"\u0000garbage', "junk after a NUL (the C string's end)"],
  ['root ::= "a"{1999}', "1999 repetitions"],
  ['root ::= "a"{1999,2005}', "1999 to 2005 repetitions (a bound past 2000 is none)"],
  ['root ::= "a"{0,2001}', "at most 2001 repetitions (unbounded past 2000)"]
] as const

/**
 * Grammars it refuses: no newline between a rule's name and ::=, a token closed by '>', junk after alternates, and
 * repetitions whose rules reach 2000 (handle_repetitions: n_prev_rules x the bound, or the least where unbounded).
 */
export const GRAMMARS_REFUSED = [
  ['root\n::= "a"', "a newline between the rule's name and ::="],
  ["root ::= <[5]", "a token id without its closing '>'"],
  ["root ::= <abc", "a token text without its closing '>'"],
  ['root ::= "a" )', "junk after a rule's alternates"],
  ['root ::= "a"{2000}', "2000 repetitions (the rules they make reach MAX_REPETITION_THRESHOLD)"],
  ['root ::= "a"{2000,}', "at least 2000 repetitions"],
  ['root ::= "a"{1,2000}', "at most 2000 repetitions"]
] as const

/** json_schemas with an unknown `type` it refuses, "Unrecognized schema": keys visit() reads only for other types. */
export const JSON_SCHEMAS_UNRECOGNIZED = [
  { type: "foo", format: "date" },
  { type: "foo", pattern: "a" },
  { type: "foo", properties: {} },
  { type: "foo", additionalProperties: false },
  { type: "foo", allOf: [{ type: "string" }] },
  { type: "foo", items: { type: "string" } }
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
