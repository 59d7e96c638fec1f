/**
 * PromText: the Prometheus text exposition format (0.0.4, and the OpenMetrics subset engines emit) read into
 * samples, and the engine's load signals picked out of them. Pure, no I/O.
 * Which series mean "running", "waiting" and "KV usage" is the engine's business (MetricNames, newest first);
 * this module only applies the rule: the first name present wins, summed over its label sets. Progress counters
 * are read each on its own (every one present, summed over its label sets).
 */

import type { MetricNames } from "./Engine.ts"
import type { LoadSignals } from "./EngineClient.ts"

/** One sample line: `name{labels} value [timestamp]`. */
export interface PromSample {
  readonly name: string
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

const parseValue = (s: string): number => {
  switch (s) {
    case "+Inf":
    case "Inf":
      return Number.POSITIVE_INFINITY
    case "-Inf":
      return Number.NEGATIVE_INFINITY
    case "NaN":
      return Number.NaN
    default:
      return s.length === 0 ? Number.NaN : Number(s)
  }
}

/** Label set `{a="x",b="y\"z"}` starting at `i` (just after `{`); returns the labels and the index after `}`. */
const parseLabels = (line: string, i: number): [Record<string, string>, number] | undefined => {
  const labels: Record<string, string> = {}
  const n = line.length
  while (i < n) {
    while (i < n && (line[i] === " " || line[i] === ",")) i++
    if (line[i] === "}") return [labels, i + 1]
    const eq = line.indexOf("=", i)
    if (eq === -1 || line[eq + 1] !== '"') return undefined
    const key = line.slice(i, eq).trim()
    let j = eq + 2
    let value = ""
    let from = j
    while (j < n && line[j] !== '"') {
      if (line[j] === "\\") {
        value += line.slice(from, j)
        const c = line[j + 1]
        value += c === "n" ? "\n" : (c ?? "")
        j += 2
        from = j
      } else {
        j++
      }
    }
    if (j >= n) return undefined
    labels[key] = value + line.slice(from, j)
    i = j + 1
  }
  return undefined
}

/**
 * Samples of a scrape, in order. Malformed lines are skipped, not fatal: one odd series must not hide the load.
 * `wanted`, when given, keeps only those metric names (and skips parsing the rest: vLLM's page is mostly histograms).
 */
export const parsePromText = (text: string, wanted?: ReadonlySet<string>): Array<PromSample> => {
  const out: Array<PromSample> = []
  let pos = 0
  const len = text.length
  while (pos < len) {
    let eol = text.indexOf("\n", pos)
    if (eol === -1) eol = len
    const line = text.slice(pos, eol).trim()
    pos = eol + 1
    if (line.length === 0 || line[0] === "#") continue
    let nameEnd = 0
    while (nameEnd < line.length && line[nameEnd] !== "{" && line[nameEnd] !== " " && line[nameEnd] !== "\t") nameEnd++
    const name = line.slice(0, nameEnd)
    if (name.length === 0 || (wanted !== undefined && !wanted.has(name))) continue
    let labels: Record<string, string> = {}
    let rest = nameEnd
    if (line[nameEnd] === "{") {
      const parsed = parseLabels(line, nameEnd + 1)
      if (parsed === undefined) continue
      ;[labels, rest] = parsed
    }
    const fields = line
      .slice(rest)
      .trim()
      .split(/[ \t]+/)
    const value = parseValue(fields[0] ?? "")
    if (Number.isNaN(value) && fields[0] !== "NaN") continue
    out.push({ name, labels, value })
  }
  return out
}

/** Sum over label sets of the first of `names` present in the scrape; undefined when none is. */
export const pickSum = (samples: ReadonlyArray<PromSample>, names: ReadonlyArray<string>): number | undefined => {
  for (const n of names) {
    let found = false
    let sum = 0
    for (const s of samples) {
      if (s.name === n && !Number.isNaN(s.value)) {
        found = true
        sum += s.value
      }
    }
    if (found) return sum
  }
  return undefined
}

/**
 * Mean over label sets of the first name present: a usage fraction summed over data-parallel engines
 * (vLLM's `engine` label) would exceed 1, so fractions are averaged, counts summed.
 */
export const pickMean = (samples: ReadonlyArray<PromSample>, names: ReadonlyArray<string>): number | undefined => {
  for (const n of names) {
    let count = 0
    let sum = 0
    for (const s of samples) {
      if (s.name === n && !Number.isNaN(s.value)) {
        count++
        sum += s.value
      }
    }
    if (count > 0) return sum / count
  }
  return undefined
}

/** All names MetricNames mentions, for parsePromText's filter. */
export const metricNameSet = (names: MetricNames): ReadonlySet<string> =>
  new Set([...names.running, ...names.waiting, ...names.kvUsage, ...(names.progress ?? [])])

/** Each of `names` present in the scrape, summed over its label sets (every one counts, not the first). */
const pickEach = (samples: ReadonlyArray<PromSample>, names: ReadonlyArray<string>): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const n of names) {
    const v = pickSum(samples, [n])
    if (v !== undefined) out[n] = v
  }
  return out
}

/** The normalized load signals of one scrape (and its progress counters, when the engine names any). */
export const loadSignals = (text: string, names: MetricNames): LoadSignals => {
  const samples = parsePromText(text, metricNameSet(names))
  const signals = {
    running: pickSum(samples, names.running),
    waiting: pickSum(samples, names.waiting),
    kvUsage: pickMean(samples, names.kvUsage)
  }
  const progress = names.progress ?? []
  if (progress.length === 0) return signals
  const withProgress = { ...signals, progress: pickEach(samples, progress) }
  return names.rankLabel === undefined
    ? withProgress
    : { ...withProgress, rankProgress: perRank(samples, [...progress, ...names.kvUsage], names.rankLabel) }
}

/** Per value of `label`, the sum of the `names` samples that carry it (one figure that moves when any of them does). */
const perRank = (
  samples: ReadonlyArray<PromSample>,
  names: ReadonlyArray<string>,
  label: string
): Record<string, number> => {
  const wanted = new Set(names)
  const out: Record<string, number> = {}
  for (const s of samples) {
    const rank = s.labels[label]
    if (rank === undefined || !wanted.has(s.name) || Number.isNaN(s.value)) continue
    out[rank] = (out[rank] ?? 0) + s.value
  }
  return out
}
