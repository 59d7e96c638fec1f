// Prometheus text of each flavor's /metrics (pure): the families of the flavor's page (metricPages.ts) with
// their HELP/TYPE lines, as prometheus_client writes them: label names sorted, a labelled family with no child
// left out, histograms as cumulative `le` buckets with `_count` and `_sum`. Per-core families get a child per
// engine core (vLLM's `engine`, SGLang's `dp_rank` under --dp-size); server-wide ones are counted over the cores.
import {
  type Child,
  type Family,
  type Labels,
  PAGES,
  type Page,
  type PageContext,
  type RankMetrics
} from "./metricPages.ts"
import { goFloat } from "./pyWords.ts"
import type { Flavor } from "./simConfig.ts"
import { Histogram } from "./stats.ts"

export type { Gauges, PageContext, RankMetrics } from "./metricPages.ts"

// vLLM's and SGLang's pages are prometheus_client's: every value and `le` bound a float written by floatToGoString
// (pyWords.ts goFloat): `1.0`, `0.25`, `+Inf`, and from 1e6 up Go's exponent, `1e+06`.
const fmt = goFloat

const esc = (s: string): string => s.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")

/** A label set as prometheus_client writes it: sorted by name (prometheus/client_python exposition.py, generate_latest). */
const labelText = (labels: Labels): string => {
  const keys = Object.keys(labels).sort()
  return keys.length === 0 ? "" : `{${keys.map((k) => `${k}="${esc(labels[k] ?? "")}"`).join(",")}}`
}

/** One registry page: each family's HELP and TYPE once, then its samples, one label set (child) after another. */
class Text {
  readonly lines: Array<string> = []
  private readonly fmt: (n: number) => string
  constructor(value: (n: number) => string = fmt) {
    this.fmt = value
  }
  private head(name: string, help: string, type: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`)
  }
  /** A gauge or counter; one with no child yet is left out, as a labelled family with no sample is. */
  values(kind: "gauge" | "counter", name: string, help: string, children: ReadonlyArray<Child>): void {
    if (children.length === 0) return
    this.head(name, help, kind)
    for (const [l, v] of children) this.lines.push(`${name}${labelText(l)} ${this.fmt(v)}`)
  }
  histogram(name: string, help: string, children: ReadonlyArray<readonly [Labels, Histogram]>): void {
    this.head(name, help, "histogram")
    for (const [l, h] of children) {
      let acc = 0
      h.buckets.forEach((b, i) => {
        acc += h.counts[i] ?? 0
        this.lines.push(`${name}_bucket${labelText({ ...l, le: fmt(b) })} ${fmt(acc)}`)
      })
      this.lines.push(`${name}_bucket${labelText({ ...l, le: "+Inf" })} ${fmt(h.count)}`)
      this.lines.push(`${name}_count${labelText(l)} ${fmt(h.count)}`, `${name}_sum${labelText(l)} ${fmt(h.sum)}`)
    }
  }
}

/**
 * A value family's children: per core, ordered by the family's own labels, then by core (vLLM's
 * request_success_total: each reason for every engine in turn); server-wide, summed over the cores.
 */
const valueChildren = (
  page: Page,
  c: PageContext,
  f: Extract<Family, { kind: "gauge" | "counter" }>,
  ranks: ReadonlyArray<RankMetrics>
): Array<Child> => {
  const groups = new Map<string, Array<Child>>()
  ranks.forEach((r, i) => {
    const base = f.scope === "rank" ? page.rankLabels(c, i, ranks.length) : page.serverLabels(c)
    for (const [own, v] of f.children(r, ranks)) {
      const key = labelText(own)
      const group = groups.get(key)
      if (group === undefined) groups.set(key, [[{ ...base, ...own }, v]])
      else if (f.scope === "rank") group.push([{ ...base, ...own }, v])
      else {
        const [labels, sum] = group[0] as Child
        group[0] = [labels, sum + v]
      }
    }
  })
  return [...groups.values()].flat()
}

/** The cores' histograms as one: bucket counts, sums and counts added. */
const merged = (hs: ReadonlyArray<Histogram>): Histogram => {
  const out = new Histogram(hs[0]?.buckets ?? [])
  for (const h of hs) {
    h.counts.forEach((n, i) => {
      out.counts[i] = (out.counts[i] ?? 0) + n
    })
    out.sum += h.sum
    out.count += h.count
  }
  return out
}

/** The /metrics body of a flavor from its engine cores' figures, or undefined where the engine has none (mlx). */
export const renderMetrics = (
  flavor: Flavor,
  c: PageContext,
  ranks: ReadonlyArray<RankMetrics>
): string | undefined => {
  const page = PAGES[flavor]
  if (page === undefined || ranks.length === 0) return undefined
  const t = new Text(page.value)
  for (const f of page.families) {
    if (f.kind === "histogram") {
      const hs = ranks.map((r) => f.hist(r.stats))
      t.histogram(
        f.name,
        f.help,
        f.scope === "rank"
          ? hs.map((h, i) => [page.rankLabels(c, i, ranks.length), h] as const)
          : [[page.serverLabels(c), merged(hs)]]
      )
    } else t.values(f.kind, f.name, f.help, valueChildren(page, c, f, ranks))
  }
  return `${t.lines.join("\n")}\n`
}
