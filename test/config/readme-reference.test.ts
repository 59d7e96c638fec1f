// README's configuration reference (the tables between <!-- section:config --> and <!-- /section:config -->)
// against the schema (src/services/config/ConfigSchema.ts): every key of the schema has a row and every row names
// a key; a row's literal default is the schema's default, and a row without one ("—", or a computed default
// such as `$NODE_NAME`) has none in the schema; a row's type is what the schema accepts and refuses. A new key
// without a row fails here.
import * as fs from "node:fs"
import * as path from "node:path"
import { Result, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { ConfigFile, knownKeys } from "../../src/services/config/ConfigSchema.ts"

const README = fs.readFileSync(path.join(import.meta.dirname, "..", "..", "README.md"), "utf8")
const START = "<!-- section:config -->"
const section = README.slice(README.indexOf(START), README.indexOf("<!-- /section:config -->"))

interface Row {
  /** `agent.heartbeat`, `models.<name>.tp` */
  readonly key: string
  /** The schema's section (`model` for `models.<name>`) and the key in it. */
  readonly section: string
  readonly name: string
  readonly type: string
  readonly default: string
}

/** The table cells of one row; `\|` inside a cell is no separator. */
const cells = (line: string): Array<string> =>
  line
    .slice(1, -1)
    .split(/(?<!\\)\|/)
    .map((c) => c.trim().replaceAll("\\|", "|"))

const rows: Array<Row> = section
  .split("\n")
  .filter((l) => /^\| `[a-z_]+\.(<name>\.)?[a-z_]+` \|/.test(l))
  .map((l) => {
    const [keyCell, type, dflt] = cells(l) as [string, string, string]
    const key = keyCell.replaceAll("`", "")
    const parts = key.split(".")
    return key.startsWith("models.<name>.")
      ? { key, section: "model", name: parts[2]!, type, default: dflt }
      : { key, section: parts[0]!, name: parts[1]!, type, default: dflt }
  })

/** The schema's keys, as the README writes them. */
const schemaKeys = Object.entries(knownKeys)
  .filter(([s]) => s !== "")
  .flatMap(([s, keys]) => keys.map((k) => (s === "model" ? `models.<name>.${k}` : `${s}.${k}`)))

/** `value` for one key in an otherwise empty file (one model, so `models` is not empty). */
const fileWith = (row: Row, value: unknown): Record<string, unknown> =>
  row.section === "model" ? { models: { m: { [row.name]: value } } } : { [row.section]: { [row.name]: value } }

const accepts = (row: Row, value: unknown): boolean =>
  Schema.decodeUnknownExit(ConfigFile)(fileWith(row, value))._tag === "Success"

/** Every default, as written in a file. */
const defaults = Schema.encodeSync(ConfigFile)(Schema.decodeUnknownSync(ConfigFile)({ models: { m: {} } })) as Record<
  string,
  Record<string, unknown>
> & { models: Record<string, Record<string, unknown>> }
const defaultOf = (row: Row): unknown =>
  row.section === "model" ? defaults.models.m?.[row.name] : defaults[row.section]?.[row.name]

/** A default cell that is a value (`"5s"`, `256`, `[]`), not "—" or a rule (`$NODE_NAME`, "the model's"). */
const literalDefault = (cell: string): { readonly value: unknown } | undefined => {
  const m = /^`([^`]+)`/.exec(cell)
  if (m === null) return undefined
  try {
    return { value: JSON.parse(m[1]!) }
  } catch {
    return undefined
  }
}

/** The literals a value outside the enumeration is refused with (`expected one of "a", "b", got ...`). */
const schemaLiterals = (row: Row): Array<string> => {
  const text =
    row.section === "model"
      ? `[models.m]\n${row.name} = "not-a-literal"\n`
      : `[${row.section}]\n${row.name} = "not-a-literal"\n[models.m]\nhf_repo = "a/b"\n`
  const r = decodeConfig(text, "probe.toml", {})
  const problems = Result.isFailure(r) ? r.failure.problems : []
  const m = problems.map((p) => /expected one of ((?:"[^"]*"(?:, )?)+), got/.exec(p)).find((x) => x !== null)
  return m ? [...m[1]!.matchAll(/"([^"]*)"/g)].map((x) => x[1]!) : []
}

/** What the type cell promises, as values the schema must accept and refuse; undefined: a type not known here. */
const promises = (type: string): { readonly ok: Array<unknown>; readonly bad: Array<unknown> } | undefined => {
  if (type === "bool") return { ok: [true, false], bad: ["yes", 1] }
  if (type === "string") return { ok: ["x"], bad: [1] }
  if (type.startsWith("path")) return { ok: ["/x/y"], bad: [1] }
  if (type.startsWith("key prefix")) return { ok: ["/cgn", "/a/b"], bad: ["cgn", "/", "/cgn/", "/a//b"] }
  if (type === "duration") return { ok: ["5s", "0s"], bad: ["5", 5] }
  if (type === "duration > 0") return { ok: ["5s", "1ms"], bad: ["0s", "5"] }
  const atLeast = /^int ≥ (\d+)$/.exec(type)
  if (atLeast !== null) {
    const min = Number(atLeast[1])
    return { ok: [min, min + 1], bad: [min - 1, min + 0.5, String(min)] }
  }
  const between = /^int (\d+)-(\d+)$/.exec(type)
  if (between !== null) {
    const [min, max] = [Number(between[1]), Number(between[2])]
    return { ok: [min, max], bad: [min - 1, max + 1] }
  }
  if (type === "number > 0") return { ok: [0.5, 2], bad: [0, -1] }
  if (type === "number in (0, 1]") return { ok: [0.5, 1], bad: [0, 1.5] }
  if (type.startsWith("host:port, not a wildcard host nor port 0"))
    return { ok: ["10.0.0.1:7071"], bad: ["0.0.0.0:7071", "10.0.0.1:0", "10.0.0.1"] }
  if (type === "host:port") return { ok: ["127.0.0.1:7071", "[::1]:0"], bad: ["127.0.0.1", "x:99999"] }
  if (type === "http(s) URL") return { ok: ["http://a:1", "https://a"], bad: ["ftp://a", "a:1"] }
  if (type === "array of http(s) URLs") return { ok: [[], ["https://a:2379"]], bad: [["a:2379"], "https://a"] }
  if (type === "array of strings") return { ok: [[], ["a"]], bad: [[1], "a"] }
  if (type === "non-empty array of strings") return { ok: [["a", "b"]], bad: [[], [1]] }
  if (type === "table of strings") return { ok: [{}, { A: "b" }], bad: [{ A: 1 }] }
  if (type.startsWith("ZMQ endpoint"))
    return { ok: ["tcp://127.0.0.1:5557", "tcp://*:5557", "ipc:///run/kv.sock", "inproc://x"], bad: ["127.0.0.1:5557"] }
  if (type === "array of ints 1-999") return { ok: [[], [1, 92, 999]], bad: [[0], [1000], [1.5], ["13"], 13] }
  if (type.startsWith("array of NVML indices"))
    return { ok: [[], [0, 3, "GPU-x", "MIG-y", "MIG-GPU-x/1/0"]], bad: [[-1], [1.5], ["nonsense"], ["gpu-x"], [""]] }
  return undefined
}

describe("README configuration reference", () => {
  it("has rows to compare", () => {
    expect(section.startsWith(START)).toBe(true)
    expect(rows.length).toBeGreaterThan(50)
  })

  it("documents every key of the schema, and no key the schema lacks", () => {
    const documented = rows.map((r) => r.key)
    expect(
      schemaKeys.filter((k) => !documented.includes(k)),
      "keys without a README row"
    ).toEqual([])
    expect(
      documented.filter((k) => !schemaKeys.includes(k)),
      "README rows of no key"
    ).toEqual([])
    expect(
      documented.filter((k, i) => documented.indexOf(k) !== i),
      "keys documented twice"
    ).toEqual([])
  })

  it.each(rows.map((r) => [r.key, r] as const))("%s: the default", (_, row) => {
    const literal = literalDefault(row.default)
    if (literal === undefined) expect(defaultOf(row), `${row.key} is documented without a default`).toBeUndefined()
    else expect(defaultOf(row)).toEqual(literal.value)
  })

  it.each(rows.map((r) => [r.key, r] as const))("%s: the type", (_, row) => {
    const literals = [...row.type.matchAll(/`([^`]+)`/g)].map((x) => x[1]!)
    if (/^`[^`]+`( \| `[^`]+`)+$/.test(row.type)) {
      expect(schemaLiterals(row)).toEqual(literals)
      return
    }
    const promised = promises(row.type)
    expect(promised, `a type this test knows: "${row.type}"`).toBeDefined()
    for (const v of promised?.ok ?? []) expect(accepts(row, v), `${row.key} = ${JSON.stringify(v)} accepted`).toBe(true)
    for (const v of promised?.bad ?? [])
      expect(accepts(row, v), `${row.key} = ${JSON.stringify(v)} refused`).toBe(false)
  })
})
