// The shipped Prometheus rules, examples/prometheus/cgn-agent-rules.yaml and the PrometheusRule the Kustomize overlay
// renders from examples/k8s/base: promtool accepts both (`check rules`), the two carry the same groups, the unit tests
// next to the file pass (`test rules`: each alert fires when it should and stays silent on a drain, a start, a
// restart). That every metric a rule reads is on a real agent's /metrics: test/observability/promtool.test.ts, which
// scrapes one.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parse, parseAllDocuments, stringify } from "yaml"
import { repoRoot } from "../support/agent.ts"
import { metricNamesIn, promtool, RULES_FILE, shippedRules } from "../support/promtool.ts"

const RULES = RULES_FILE
const RULE_TESTS = path.join(repoRoot, "examples", "prometheus", "cgn-agent-rules.test.yaml")
const OVERLAY = path.join(repoRoot, "examples", "k8s", "overlays", "example")

interface RuleTests {
  readonly rule_files: ReadonlyArray<string>
  readonly tests: ReadonlyArray<{
    readonly alert_rule_test?: ReadonlyArray<{
      readonly alertname: string
      readonly exp_alerts: ReadonlyArray<unknown>
    }>
  }>
}

const rulesFile = shippedRules()
const rules = rulesFile.groups.flatMap((g) => g.rules)
const alerts = rules.filter((r) => r.alert !== undefined)

interface Doc {
  readonly kind: string
  readonly apiVersion: string
  readonly metadata: { readonly name: string; readonly namespace?: string }
  readonly spec: unknown
}

/** The overlay as `kubectl apply -k` would send it. */
const renderOverlay = (): Array<Doc> =>
  parseAllDocuments(execFileSync("kubectl", ["kustomize", OVERLAY], { encoding: "utf8" })).map((d) => d.toJS() as Doc)

describe("the shipped Prometheus rules", () => {
  let tmp = ""
  beforeAll(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-rules-"))
  })
  afterAll(() => {
    fs.rmSync(tmp, { recursive: true, force: true })
  })

  it("pass promtool check rules, as a rules file and as the overlay's PrometheusRule, which carries the same groups", () => {
    const plain = promtool(["check", "rules", RULES])
    expect(plain.output).toContain(`SUCCESS: ${rules.length} rules found`)
    expect(plain.status).toBe(0)

    const docs = renderOverlay()
    const rule = docs.find((d) => d.kind === "PrometheusRule")
    expect(rule, "the overlay renders a PrometheusRule").toBeDefined()
    expect(rule!.apiVersion).toBe("monitoring.coreos.com/v1")
    // The same groups as the plain file, so promtool's unit tests below hold for it too.
    expect(rule!.spec, "prometheusrule.yaml's spec differs from cgn-agent-rules.yaml: change both").toEqual(rulesFile)
    const extracted = path.join(tmp, "prometheusrule-spec.yaml")
    fs.writeFileSync(extracted, stringify(rule!.spec))
    const operator = promtool(["check", "rules", extracted])
    expect(operator.output).toContain(`SUCCESS: ${rules.length} rules found`)
    expect(operator.status).toBe(0)

    // CgnAgentTargetDown's job regex takes the PodMonitor's job (prometheus-operator's default: <namespace>/<name>,
    // pkg/prometheus/promcfg.go) and a plain job_name `cgn-agent`; Prometheus anchors its regexes.
    const podMonitor = docs.find((d) => d.kind === "PodMonitor")!
    const targetDown = alerts.find((a) => a.alert === "CgnAgentTargetDown")!
    const jobRegex = new RegExp(`^(?:${/job=~"([^"]+)"/.exec(targetDown.expr)![1]})$`)
    expect(`${podMonitor.metadata.namespace}/${podMonitor.metadata.name}`).toMatch(jobRegex)
    expect("cgn-agent").toMatch(jobRegex)
    expect("node-exporter").not.toMatch(jobRegex)
  })

  it("pass their promtool unit tests, which make each alert fire once and stay silent once", () => {
    const r = promtool(["test", "rules", RULE_TESTS])
    expect(r.output).toContain("SUCCESS")
    expect(r.status).toBe(0)

    const suite = parse(fs.readFileSync(RULE_TESTS, "utf8")) as RuleTests
    expect(suite.rule_files).toEqual([path.basename(RULES)])
    const cases = suite.tests.flatMap((t) => t.alert_rule_test ?? [])
    const untested = alerts
      .map((a) => a.alert!)
      .flatMap((name) => {
        const own = cases.filter((c) => c.alertname === name)
        return [
          ...(own.some((c) => c.exp_alerts.length > 0) ? [] : [`${name}: no case where it fires`]),
          ...(own.some((c) => c.exp_alerts.length === 0) ? [] : [`${name}: no case where it stays silent`])
        ]
      })
    expect(untested).toEqual([])
  })

  it("give each alert a delay, a severity and what to do", () => {
    expect(alerts.length).toBeGreaterThan(15)
    const lacking = alerts.flatMap((a) => {
      const missing = [
        ...(a.for === undefined ? ["for"] : []),
        // info: worth a look in working hours, never a page (a forgotten cordon)
        ...(["info", "warning", "critical"].includes(a.labels?.severity ?? "") ? [] : ["severity"]),
        ...(a.annotations?.summary ? [] : ["summary"]),
        // runbook-style: the description points at the README section that explains the state
        ...(a.annotations?.description?.includes("README: ") ? [] : ["description with README: <section>"])
      ]
      return missing.length === 0 ? [] : [`${a.alert}: ${missing.join(", ")}`]
    })
    expect(lacking).toEqual([])
  })

  it("read metric names the way PromQL does", () => {
    expect(
      metricNamesIn(
        'sum without (role) (rate(cgn_agent_requets_total{grpc_code=~"OK|x"}[5m])) > 0.5 unless on (instance) up offset 15m'
      )
    ).toEqual(["cgn_agent_requets_total", "up"])
    expect(
      metricNamesIn("cgn_agent:a:rate5m / ignoring (x) group_left histogram_quantile(0.95, b_bucket) < 7 * 86400")
    ).toEqual(["cgn_agent:a:rate5m", "b_bucket"])
  })
})
