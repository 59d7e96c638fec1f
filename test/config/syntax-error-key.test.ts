// Which key a TOML syntax error is in (services/config/SyntaxErrorKey.ts): smol-toml gives a line and a column only,
// so the decoder names the key path from the text around the error. A line it cannot place names no key.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { syntaxErrorKey } from "../../src/services/config/SyntaxErrorKey.ts"

/** [what, the text, the error's line, the key named]. */
const cases: ReadonlyArray<[string, string, number, string | undefined]> = [
  ["a key in a table", '[engine]\nkind = "vllm"\nurl = http://x\n', 3, "engine.url"],
  ["a top-level key", "max_inflight = = 1\n", 1, "max_inflight"],
  ["a model's key, quoted as other problems quote it", '[models."m"]\nhf_repo = "a/b"\ntp = = 2\n', 3, 'models."m".tp'],
  ["a dotted key and a quoted part", "[engine]\nenv.'A B' = x\n", 2, 'engine.env."A B"'],
  ["a table header with spaces and a comment", "[ agent ]  # the agent\nheartbeat = 5s\n", 2, "agent.heartbeat"],
  ["an array of tables' header", "[[engine.extra]]\nx = ?\n", 2, "engine.extra.x"],
  ["a multi-line array the error is inside", '[cluster]\netcd = [\n  "a",\n  "b"\n,,]\n', 5, "cluster.etcd"],
  ["an inline table spanning lines", '[engine]\nenv = {\n  A = "1",\n  B = ?\n}\n', 4, "engine.env.B"],
  ["a closed value above is not the key of a stray line", '[agent]\nnode_id = "a"\n}}}\n', 3, undefined],
  ["a bracket inside a string does not leave a value open", '[agent]\nnode_id = "a[b"\n)\n', 3, undefined],
  ["an error in a header names no key", '[engine\nkind = "x"\n', 1, undefined],
  ["a table defined twice: its header's path", '[agent]\nnode_id = "a"\n[agent]\nheartbeat = "5s"\n', 3, "agent"],
  ["a model's table defined twice", '[models."m"]\ntp = 1\n[ models."m" ]  # again\n', 3, 'models."m"'],
  ["CRLF line ends", "[agent]\r\nheartbeat = 5s\r\n", 2, "agent.heartbeat"],
  ["a line out of range", "a = 1\n", 9, undefined],
  // a header-like line inside a multi-line string above: no key rather than agent.url
  ["after a multi-line string", '[engine]\nnote = """\n[agent]\n"""\nurl = http://x\n', 5, undefined],
  ["after a literal multi-line string", "[engine]\nnote = '''\nfoo = [\n'''\nurl = ?\n", 5, undefined],
  // a `]` forgotten: the next key's line is inside the array (no key there), and the keys above are closed
  [
    "an array left open: the error is in it, not in the key text after it",
    '[engine]\nkind = "vllm"\nurl = "http://x"\nargs = ["--a", "b"\nstop_grace = "5s"\n',
    5,
    "engine.args"
  ],
  [
    "an inline table's key after a closed array in it",
    '[engine]\nenv = {\n  A = ["x"],\n  B = ?\n}\n',
    4,
    "engine.env.B"
  ],
  [
    "a key after a multi-line array closed on its own line: its own key, not the array's",
    "a = [\n 1,\n]\nb = @\n",
    4,
    "b"
  ],
  ["an error on the last line, with no newline after it", "[agent]\nnode_id = @", 2, "agent.node_id"],
  // never a wrong key: one inside a table whose key cannot be read back is none
  ["a key in an inline table whose own key does not unescape", '"a\\q" = {\nb = @\n', 2, undefined]
]

describe("syntaxErrorKey", () => {
  it.each(cases)("%s", (_what, text, line, key) => {
    expect(syntaxErrorKey(text, line)).toBe(key)
  })

  it("the decoder's problem line: the key, then smol-toml's line and column and reason", () => {
    const r = decodeConfig('[engine]\nkind = "vllm"\nurl = http://x\n', "bad.toml", {})
    expect(Result.isFailure(r) ? r.failure.problems : []).toEqual([
      "engine.url: line 3, column 7: Invalid TOML document: invalid value"
    ])
  })

  it("a table defined twice: the decoder's problem names it", () => {
    const r = decodeConfig('[agent]\nnode_id = "a"\n\n[agent]\nheartbeat = "5s"\n', "bad.toml", {})
    expect(Result.isFailure(r) ? r.failure.problems : []).toEqual([
      expect.stringMatching(/^agent: line 4, column \d+: Invalid TOML document: trying to redefine/)
    ])
  })

  it("where no key can be placed the problem keeps its line and column alone", () => {
    const r = decodeConfig('[engine\nkind = "x"\n', "bad.toml", {})
    expect(Result.isFailure(r) ? r.failure.problems : []).toEqual([
      "line 1, column 8: Invalid TOML document: illegal character in key"
    ])
  })
})
