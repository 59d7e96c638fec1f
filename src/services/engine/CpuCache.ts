/**
 * The engine's CPU KV-cache tier: host RAM a KV connector takes in the agent's memory cgroup, which the engine
 * shares. Each backend says, as data, where its connector takes the tier's size from (LaunchPlan.cpuCache: the
 * sources in the connector's own order of precedence, and whether every GPU worker holds one); `cpuCacheSize` works
 * the size out from the engine's environment, its argv and the text of a config file the environment names, which
 * the caller reads (layers/engine/cpuCache.ts). Pure: no I/O.
 */

import { lastFlagValue } from "./ArgvFlags.ts"

/** A size unit as the connector reads its setting. */
export interface CpuCacheUnit {
  readonly name: string
  readonly bytes: number
}

export const GB: CpuCacheUnit = { name: "GB", bytes: 1e9 }
export const GIB: CpuCacheUnit = { name: "GiB", bytes: 2 ** 30 }

/** One place the size may come from; the first that is set decides, the next ones are not looked at. */
export type CpuCacheSource =
  /**
   * A variable in `unit`s; `unlessSet`, set, sizes the tier another way (a block count): the size is unknown.
   * `unquote`: the connector strips one pair of matching quotes around the value first (`"5"` reads as 5).
   */
  | {
      readonly kind: "env"
      readonly name: string
      readonly unit: CpuCacheUnit
      readonly unlessSet?: string
      readonly unquote?: boolean
    }
  /** The top-level `key: value` of a YAML file the variable names; a file that does not set the key: next. */
  | { readonly kind: "file"; readonly variable: string; readonly key: string; readonly unit: CpuCacheUnit }
  /**
   * A flag's last value in argv (`--f V` or `--f=V`, argparse's last wins); a number at or below `unsetAtOrBelow`
   * means not set (the next source decides), as the engine reads it.
   */
  | { readonly kind: "flag"; readonly flag: string; readonly unit: CpuCacheUnit; readonly unsetAtOrBelow?: number }
  /** The connector's own default, said as `setting`. */
  | { readonly kind: "default"; readonly setting: string; readonly units: number; readonly unit: CpuCacheUnit }
  /** The engine sizes it from what only it knows (a ratio of its GPU KV pool): `why`. */
  | { readonly kind: "unknown"; readonly why: string }

/** Where the tier's size comes from (LaunchPlan.cpuCache). */
export interface CpuCacheTier {
  readonly sources: ReadonlyArray<CpuCacheSource>
  /** Each GPU worker allocates the size for itself: how many there are and what makes them (`tp 4 x dp 2`). */
  readonly perWorker?: { readonly workers: number; readonly what: string }
  /** What to change to lower the tier, said in the warning. */
  readonly lower: string
}

/** A config file as the caller read it: its text, or why it could not be. */
export type ConfigFileRead = { readonly text: string } | { readonly error: string }

/** The inputs the sources are read from. */
export interface CpuCacheInputs {
  /** The engine's whole environment (EngineEnvironment.engineEnvironment). */
  readonly env: Readonly<Record<string, string | undefined>>
  readonly argv: ReadonlyArray<string>
  /** The files of `cpuCacheFiles`, by path; one missing here counts as not read. */
  readonly files: Readonly<Record<string, ConfigFileRead>>
}

/** The tier's size; undefined when no source is set (no tier). */
export type CpuCacheSize =
  | { readonly kind: "known"; readonly setting: string; readonly bytes: number }
  | { readonly kind: "unknown"; readonly why: string }

/** The config files the sources name in `env`, to be read before `cpuCacheSize`. */
export const cpuCacheFiles = (
  tier: CpuCacheTier | undefined,
  env: Readonly<Record<string, string | undefined>>
): ReadonlyArray<string> =>
  (tier?.sources ?? []).flatMap((s) => {
    const file = s.kind === "file" ? (env[s.variable] ?? "").trim() : ""
    return file === "" ? [] : [file]
  })

/** A setting's value as a number (Python's float() or int() of it, as the connectors convert), or undefined. */
const numberOf = (value: string): number | undefined => {
  const t = value.trim()
  const n = t === "" ? Number.NaN : Number(t)
  return Number.isFinite(n) ? n : undefined
}

/** A size setting's value as a number of units, or undefined (not a number, or below 0). */
const unitsOf = (value: string): number | undefined => {
  const n = numberOf(value)
  return n !== undefined && n >= 0 ? n : undefined
}

/**
 * The value inside one pair of matching quotes around it (after trimming), else the value: LMCache's reading of its
 * environment (LMCache/LMCache lmcache/v1/config_base.py, commit 082c5012, `_parse_quoted_string`, applied by
 * from_env and update_config_from_env before the converter; its escape sequences aside).
 */
const unquoted = (value: string): string => {
  const t = value.trim()
  return t.length >= 2 && t[0] === t[t.length - 1] && (t[0] === '"' || t[0] === "'") ? t.slice(1, -1) : value
}

const known = (setting: string, units: number, unit: CpuCacheUnit): CpuCacheSize => ({
  kind: "known",
  setting,
  bytes: units * unit.bytes
})

const notANumber = (setting: string): CpuCacheSize => ({ kind: "unknown", why: `${setting} is not a size` })

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/**
 * A top-level `key: value` line of a YAML file (no indentation, the key bare or quoted, a ` #` comment after it):
 * the last one, as PyYAML keeps the last of a repeated key; its value unquoted. Anything else (a nested or flow
 * mapping, a JSON file) is not read here, and `mentioned` says whether the key is in the text at all.
 */
const topLevelValue = (text: string, key: string): { readonly value?: string; readonly mentioned: boolean } => {
  const line = new RegExp(`^(["']?)${escapeRegExp(key)}\\1[ \\t]*:(?:[ \\t]+(.*?))?[ \\t]*$`, "gm")
  let value: string | undefined
  for (const m of text.matchAll(line)) value = (m[2] ?? "").replace(/\s+#.*$/, "").replace(/^(["'])(.*)\1$/, "$2")
  return value === undefined ? { mentioned: text.includes(key) } : { value, mentioned: true }
}

/** What one source says: a size, unknown, or undefined when it is not set (the next source decides). */
const fromSource = (source: CpuCacheSource, inputs: CpuCacheInputs): CpuCacheSize | undefined => {
  switch (source.kind) {
    case "env": {
      const other = source.unlessSet === undefined ? "" : (inputs.env[source.unlessSet] ?? "").trim()
      if (other !== "") return { kind: "unknown", why: `${source.unlessSet}=${other} sizes it instead` }
      const raw = inputs.env[source.name]
      const value = raw !== undefined && source.unquote === true ? unquoted(raw) : raw
      if (value === undefined || value.trim() === "") return undefined
      const units = unitsOf(value)
      const setting = `${source.name}=${raw}`
      return units === undefined ? notANumber(setting) : known(setting, units, source.unit)
    }
    case "file": {
      const file = (inputs.env[source.variable] ?? "").trim()
      if (file === "") return undefined
      const where = `${file} (${source.variable})`
      const read = inputs.files[file]
      if (read === undefined) return { kind: "unknown", why: `set in ${where}, which was not read` }
      if ("error" in read) return { kind: "unknown", why: `set in ${where}, which could not be read: ${read.error}` }
      const found = topLevelValue(read.text, source.key)
      if (found.value === undefined) {
        return found.mentioned
          ? { kind: "unknown", why: `${source.key} is in ${where}, but not as a top-level "key: value" line` }
          : undefined
      }
      const units = unitsOf(found.value)
      const setting = `${source.key}: ${found.value} in ${where}`
      return units === undefined ? notANumber(setting) : known(setting, units, source.unit)
    }
    case "flag": {
      const value = lastFlagValue(inputs.argv, source.flag)
      if (value === undefined) return undefined
      const n = numberOf(value)
      if (n !== undefined && source.unsetAtOrBelow !== undefined && n <= source.unsetAtOrBelow) return undefined
      const units = unitsOf(value)
      const setting = `${source.flag} ${value}`
      return units === undefined ? notANumber(setting) : known(setting, units, source.unit)
    }
    case "default":
      return known(source.setting, source.units, source.unit)
    case "unknown":
      return { kind: "unknown", why: source.why }
  }
}

/** The tier's size in total (every GPU worker's when each holds one); undefined when the plan has none or none is set. */
export const cpuCacheSize = (tier: CpuCacheTier | undefined, inputs: CpuCacheInputs): CpuCacheSize | undefined => {
  for (const source of tier?.sources ?? []) {
    const size = fromSource(source, inputs)
    if (size === undefined) continue
    const workers = tier?.perWorker
    if (size.kind === "unknown" || workers === undefined || workers.workers === 1) return size
    return {
      kind: "known",
      setting: `${size.setting} per GPU worker x ${workers.workers} (${workers.what})`,
      bytes: size.bytes * workers.workers
    }
  }
  return undefined
}
