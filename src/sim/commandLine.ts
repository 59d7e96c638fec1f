// Generic command-line handling for the simulator (pure): the flavor and the launcher words in front, the
// split into flags and values, JSON-object flags with dotted overrides, numbers and durations.
import { BOOLEAN_FLAGS, FLAVORS } from "./flagTables.ts"
import { ArgsError, type Flavor } from "./simConfig.ts"

/** `0ms`, `50ms`, `2s`, `1.5s`, `1m`, `250` (ms). */
export const parseDuration = (text: string): number => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim())
  if (m === null) throw new ArgsError(`invalid duration: ${text}`)
  const n = Number(m[1])
  const unit = m[2] ?? "ms"
  return unit === "ms" ? n : unit === "s" ? n * 1000 : unit === "m" ? n * 60_000 : n * 3_600_000
}

/** The flavor from `--flavor`, else guessed from the first words; the rest of the line without launcher words. */
export const detectFlavor = (argv: ReadonlyArray<string>): { flavor: Flavor; rest: Array<string> } => {
  const rest = [...argv]
  const fi = rest.indexOf("--flavor")
  if (fi >= 0) {
    const f = rest[fi + 1] as Flavor
    if (!FLAVORS.includes(f)) throw new ArgsError(`unknown flavor: ${rest[fi + 1]}`)
    rest.splice(fi, 2)
    stripLauncher(rest)
    return { flavor: f, rest }
  }
  stripLauncher(rest)
  const first = rest[0]
  if (first === "serve") return { flavor: "vllm", rest }
  if (first === "-m" && rest[1]?.startsWith("sglang") === true) return { flavor: "sglang", rest }
  if (first === "-m" && rest[1]?.startsWith("mlx_lm") === true) return { flavor: "mlx", rest }
  if (rest.includes("--model-path") || rest.includes("--tp-size")) return { flavor: "sglang", rest }
  if (first === "-m" || first === "-hf" || first === "--hf-repo" || rest.includes("-np")) {
    return { flavor: "llama_cpp", rest }
  }
  if (first === "--model") return { flavor: "mlx", rest }
  return { flavor: "vllm", rest }
}

/** Drops launcher words an override may leave in front (`vllm`, `python -m sglang.launch_server`, ...). */
const stripLauncher = (rest: Array<string>): void => {
  for (;;) {
    const w = rest[0]
    if (w === "vllm" || w === "python" || w === "python3" || w === "llama-server" || w === "mlx_lm.server") {
      rest.shift()
    } else if (w === "-m" && (rest[1]?.startsWith("sglang.") === true || rest[1]?.startsWith("mlx_lm") === true)) {
      rest.splice(0, 2)
    } else if (w === "-m" && rest[1]?.startsWith("sglang") === true) {
      rest.splice(0, 2)
    } else return
  }
}

/** A command line split into `--name value` pairs, bare flags, positional words and `--name.key value` parts. */
export interface Parsed {
  readonly values: Map<string, string>
  readonly flags: Set<string>
  readonly positional: Array<string>
  readonly dotted: Map<string, Array<[string, string]>>
}

/** Splits the words; a flag not in BOOLEAN_FLAGS takes the next word as its value unless that is a flag. */
export const tokenize = (rest: ReadonlyArray<string>): Parsed => {
  const values = new Map<string, string>()
  const flags = new Set<string>()
  const positional: Array<string> = []
  const dotted = new Map<string, Array<[string, string]>>()
  for (let i = 0; i < rest.length; i++) {
    const w = rest[i] ?? ""
    if (!w.startsWith("-") || /^-\d/.test(w)) {
      positional.push(w)
      continue
    }
    let name = w
    let value: string | undefined
    const eq = w.indexOf("=")
    if (eq > 0) {
      name = w.slice(0, eq)
      value = w.slice(eq + 1)
    }
    if (value === undefined && !BOOLEAN_FLAGS.has(name)) {
      const next = rest[i + 1]
      if (next !== undefined && (!next.startsWith("-") || /^-\d/.test(next))) {
        value = next
        i++
        // --served-model-name takes several names; keep the first.
        if (name === "--served-model-name") {
          while (rest[i + 1] !== undefined && !(rest[i + 1] ?? "").startsWith("-")) i++
        }
      }
    }
    const dot = name.indexOf(".")
    if (name.startsWith("--") && dot > 0) {
      const base = name.slice(0, dot)
      const list = dotted.get(base) ?? []
      list.push([name.slice(dot + 1), value ?? "true"])
      dotted.set(base, list)
      continue
    }
    if (value === undefined) flags.add(name)
    else values.set(name, value)
  }
  return { values, flags, positional, dotted }
}

/** A JSON-object flag (`--kv-transfer-config {...}`), with vLLM's dotted overrides (`--name.a.b v`, `--name.list+ v`) merged in. */
export const parseJsonFlag = (p: Parsed, name: string): Record<string, unknown> | undefined => {
  let obj: Record<string, unknown> | undefined
  const text = p.values.get(name)
  if (text !== undefined) {
    try {
      const v: unknown = JSON.parse(text)
      if (typeof v !== "object" || v === null || Array.isArray(v)) throw new ArgsError(`${name}: not a JSON object`)
      obj = v as Record<string, unknown>
    } catch (e) {
      throw new ArgsError(`${name}: ${e instanceof Error ? e.message : String(e)}`)
    }
  }
  for (const [key, raw] of p.dotted.get(name) ?? []) {
    obj ??= {}
    const append = key.endsWith("+")
    const parts = (append ? key.slice(0, -1) : key).split(".")
    let cur: Record<string, unknown> = obj
    for (const part of parts.slice(0, -1)) {
      const next = cur[part]
      if (typeof next !== "object" || next === null) cur[part] = {}
      cur = cur[part] as Record<string, unknown>
    }
    const leaf = parts[parts.length - 1] ?? ""
    const value = coerce(raw)
    if (append) {
      const arr = Array.isArray(cur[leaf]) ? (cur[leaf] as Array<unknown>) : []
      arr.push(value)
      cur[leaf] = arr
    } else cur[leaf] = value
  }
  return obj
}

const coerce = (raw: string): unknown => {
  if (raw === "true" || raw === "True") return true
  if (raw === "false" || raw === "False") return false
  if (/^-?\d+(\.\d+)?$/.test(raw)) return Number(raw)
  return raw
}

/** A numeric flag value; throws ArgsError naming the flag when it is not a number. */
export const num = (text: string | undefined, name: string): number | undefined => {
  if (text === undefined) return undefined
  const n = Number(text)
  if (!Number.isFinite(n)) throw new ArgsError(`${name}: not a number: ${text}`)
  return n
}
