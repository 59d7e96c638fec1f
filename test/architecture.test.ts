// The architecture's invariants (docs/ARCHITECTURE.md "Invariants"), stated as absences and checked on the
// source text: each test names the rule, and a failure lists the files that break it.
import fs from "node:fs"
import path from "node:path"
import { describe, expect, it } from "vitest"

const ROOT = path.join(import.meta.dirname, "..")
const SRC = path.join(ROOT, "src")

const walk = (dir: string): Array<string> =>
  fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name)
    return e.isDirectory() ? walk(p) : e.name.endsWith(".ts") ? [p] : []
  })

/** Every hand-written source file, as a path relative to the repository root. */
const sources = walk(SRC)
  .map((f) => path.relative(ROOT, f))
  .filter((f) => !f.startsWith("src/gen/"))
const text = new Map(sources.map((f) => [f, fs.readFileSync(path.join(ROOT, f), "utf8")]))

interface Import {
  readonly file: string
  readonly specifier: string
  /** `import type` / `export type`: erased, no runtime dependency. */
  readonly typeOnly: boolean
  /** The names it binds (`{ A, type B }` -> A, B; `* as X` -> X). */
  readonly names: ReadonlyArray<string>
}

const importRx = /^\s*(import|export)\s+(type\s+)?([^"']*?)from\s+["']([^"']+)["']|^\s*import\s+["']([^"']+)["']/gm
const dynamicRx = /import\(\s*["']([^"']+)["']\s*\)/g
const importsOf = (file: string, src: string): Array<Import> => {
  const found: Array<Import> = []
  for (const m of src.matchAll(importRx)) {
    const names = (m[3] ?? "")
      .replace(/[{}]|\*\s+as|\btype\b/g, " ")
      .split(/[\s,]+/)
      .filter((n) => /^\w+$/.test(n))
    found.push({ file, specifier: m[4] ?? m[5]!, typeOnly: m[2] !== undefined, names })
  }
  for (const m of src.matchAll(dynamicRx)) found.push({ file, specifier: m[1]!, typeOnly: false, names: [] })
  return found
}
const imports: Array<Import> = sources.flatMap((file) => importsOf(file, text.get(file)!))
/** The tests' and benchmarks' imports too: they use dependencies by the same rule. */
const allImports: Array<Import> = [
  ...imports,
  ...[...walk(path.join(ROOT, "test")), ...walk(path.join(ROOT, "bench"))].flatMap((f) =>
    importsOf(path.relative(ROOT, f), fs.readFileSync(f, "utf8"))
  )
]

/** The repository-relative file a relative specifier names (undefined for a package). */
const target = (i: Import): string | undefined =>
  i.specifier.startsWith(".") ? path.normalize(path.join(path.dirname(i.file), i.specifier)) : undefined

const within = (file: string | undefined, ...dirs: Array<string>): boolean =>
  file !== undefined && dirs.some((d) => (d.endsWith(".ts") ? file === d : file.startsWith(`${d}/`)))

const show = (xs: ReadonlyArray<Import>): Array<string> => xs.map((i) => `${i.file} -> ${i.specifier}`)

describe("architecture invariants", () => {
  it("dependencies point one way: programs -> layers -> services; nothing below imports a program", () => {
    const upward = imports.filter((i) => {
      const t = target(i)
      if (within(i.file, "src/services")) return within(t, "src/layers", "src/programs", "src/testing")
      if (within(i.file, "src/layers")) return within(t, "src/programs", "src/testing")
      if (within(i.file, "src/testing")) return within(t, "src/programs")
      return false
    })
    expect(show(upward)).toEqual([])
  })

  it("contracts do no I/O: src/services imports no node:* module", () => {
    expect(show(imports.filter((i) => within(i.file, "src/services") && i.specifier.startsWith("node:")))).toEqual([])
  })

  it("protobuf codecs (encode, decode, JSON) are called only at the wire edges", () => {
    // The wire edges: the gRPC concern, the etcd value (registry), admin /status JSON, the CLI client.
    // Elsewhere generated messages are plain data (their types, and fromPartial for proto3's defaults).
    const wireEdges = [
      "src/layers/grpc",
      "src/services/grpc",
      "src/layers/registry",
      "src/layers/admin",
      "src/programs/generate.ts"
    ]
    const offenders: Array<string> = []
    for (const i of imports) {
      if (i.typeOnly || !within(target(i), "src/gen") || within(i.file, ...wireEdges)) continue
      for (const name of i.names)
        if (new RegExp(`\\b${name}\\.(encode|decode|toJSON|fromJSON)\\(`).test(text.get(i.file)!))
          offenders.push(`${i.file}: ${name}`)
    }
    expect(offenders).toEqual([])
  })

  it("no engine-kind decision outside the engine backends (kinds differ only as data there)", () => {
    const kinds = "vllm|sglang|llama_cpp|mlx|openai_compat"
    const decision = new RegExp(`(===|!==|case)\\s*"(${kinds})"|"(${kinds})"\\s*(===|!==)`)
    const allowed = ["src/layers/engine/backends", "src/sim", "src/programs/sim.ts"]
    const offenders = sources.filter((f) => !within(f, ...allowed) && decision.test(text.get(f)!))
    expect(offenders).toEqual([])
    // ... nor a table keyed by kind (a second copy of the backends' data, which a new kind would pass unseen): two
    // kinds as object keys in one file, one per line or in a one-line object
    const keyed = new RegExp(`(?:^|[{,])\\s*"?(${kinds})"?\\s*:`, "gm")
    const tables = sources.filter(
      (f) => !within(f, ...allowed, "src/gen") && new Set([...text.get(f)!.matchAll(keyed)].map((m) => m[1])).size >= 2
    )
    expect(tables).toEqual([])
  })

  it("gRPC status codes are chosen in the one table (services/grpc/GrpcStatus.ts, its engine part EngineStatus.ts), nowhere else", () => {
    const code =
      /\b(Status|status)\.(OK|CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED)\b/
    // The CLI client reads statuses (it chooses none for the agent); the table is the one place that chooses.
    const allowed = ["src/services/grpc/GrpcStatus.ts", "src/services/grpc/EngineStatus.ts", "src/programs/generate.ts"]
    expect(sources.filter((f) => !within(f, ...allowed) && code.test(text.get(f)!))).toEqual([])
    // ... nor by name as a string ("CANCELLED"): a status decided outside the table, or a label that can drift from it
    const named =
      /"(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED)"/
    const decides = (line: string) => !/^\s*(\*|\/\/|\/\*)/.test(line) && named.test(line)
    const stringly = sources.filter((f) => !within(f, ...allowed, "src/gen") && text.get(f)!.split("\n").some(decides))
    expect(stringly).toEqual([])
  })

  it("no module over 320 lines (generated code aside)", () => {
    const long = sources
      .map((f) => [f, text.get(f)!.split("\n").length] as const)
      .filter(([, lines]) => lines > 320)
      .map(([f, lines]) => `${f}: ${lines}`)
    expect(long).toEqual([])
  })

  it("dependencies are used through their public entry points only (package.json exports), in tests too", () => {
    const privateUse: Array<string> = []
    for (const i of allImports) {
      if (i.specifier.startsWith(".") || i.specifier.startsWith("node:")) continue
      const parts = i.specifier.split("/")
      const name = i.specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]!
      const sub = i.specifier.slice(name.length)
      if (sub === "") continue
      const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "node_modules", name, "package.json"), "utf8")) as {
        exports?: Record<string, unknown> | string
      }
      const exported =
        typeof pkg.exports === "object" &&
        Object.keys(pkg.exports).some((k) => {
          if (!k.includes("*")) return k === `.${sub}`
          const [head, tail] = k.split("*") as [string, string]
          return `.${sub}`.startsWith(head) && `.${sub}`.endsWith(tail)
        })
      if (!exported) privateUse.push(`${i.file} -> ${i.specifier}`)
    }
    // createRequire is how a private path is reached without an import statement.
    for (const f of sources) if (/\bcreateRequire\b/.test(text.get(f)!)) privateUse.push(`${f}: createRequire`)
    expect(privateUse).toEqual([])
  })

  it("test doubles live in src/testing, not among the live layers", () => {
    const doubles = sources.filter((f) => within(f, "src/layers") && /Test\.ts$|Fake|Stub/.test(path.basename(f)))
    expect(doubles).toEqual([])
    // Nor a test layer exported by a live module (Nvml's fixed GPU list and the bare Metrics registry were).
    const testExports = sources
      .filter((f) => within(f, "src/layers"))
      .flatMap((f) =>
        [...text.get(f)!.matchAll(/^export const (layer(?:Test|Fixed|Fake|Stub)\w*)/gm)].map((m) => `${f}: ${m[1]}`)
      )
    expect(testExports).toEqual([])
  })
})
