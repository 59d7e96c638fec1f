/**
 * `cgn-agent render --config F [--json]`: prints the engine's launch plan exactly as it would be
 * spawned (argv as a shell command line, env, URLs, probe, metrics, KV events), secrets redacted.
 * Nothing is started. The text layout is produced by the pure `formatPlan`.
 */
import { Console, Effect } from "effect"
import { Command, Flag } from "effect/cli"
import { redactPlan } from "../layers/engine/backends/redact.ts"
import { resolvePlan } from "../layers/engine/EnginePlan.ts"
import type { LaunchPlan } from "../services/engine/Engine.ts"
import { preflight } from "./check.ts"
import { configFlag, loadConfig } from "./configOption.ts"
import { nvmlWorkerEntry } from "./programPaths.ts"

/** Quotes one word for a POSIX shell; plain words stay as they are. */
export const shellQuote = (word: string): string =>
  /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`

/** The plan as text; pass it through `redactPlan` first. */
export const formatPlan = (plan: LaunchPlan): string => {
  const env = Object.entries(plan.env)
  const probe =
    plan.probe.kind === "http"
      ? `GET ${plan.probe.url} (200 = ready)`
      : `POST ${plan.probe.url} ${JSON.stringify(plan.probe.body)} (a 1-token completion)`
  const metrics =
    plan.metrics === undefined
      ? "none"
      : `${plan.metrics.url} (running ${plan.metrics.names.running.join("|")}, waiting ${plan.metrics.names.waiting.join("|")}, kv usage ${plan.metrics.names.kvUsage.join("|") || "-"})`
  const kv = plan.kvEvents
  const events =
    kv === undefined
      ? "off"
      : `${kv.endpoint} (engine ${kv.engineBinds ? "binds" : "connects"}, topic "${kv.topic}"${kv.replayEndpoint !== undefined ? `, replay ${kv.replayEndpoint}` : ""})`
  return [
    `engine:    ${plan.kind}${plan.spawns ? "" : ` (not spawned: the agent proxies an existing ${plan.proxiedKind === undefined ? "server" : `${plan.proxiedKind} server, and speaks as that engine`})`}`,
    `command:   ${plan.spawns ? plan.argv.map(shellQuote).join(" ") : "(none)"}`,
    `env:       ${env.length === 0 ? "(none added)" : ""}`.trimEnd(),
    ...env.map(([k, v]) => `  ${k}=${shellQuote(v)}`),
    `base url:  ${plan.baseUrl}${plan.authorization === undefined ? "" : " (each request with the engine's API key: engine.api_key)"}`,
    `probe:     ${probe}`,
    `metrics:   ${metrics}`,
    `kv events: ${events}`,
    `model:     ${plan.servedModel}${plan.requestModel !== plan.servedModel ? ` (forwarded as ${plan.requestModel})` : ""}`
  ].join("\n")
}

export const render = Command.make(
  "render",
  {
    config: configFlag,
    json: Flag.Boolean("json").pipe(Flag.withDescription("Print the plan as JSON"), Flag.withDefault(false))
  },
  ({ config, json }) =>
    Effect.gen(function* () {
      const c = yield* loadConfig(config)
      // a config `run` refuses (the admin port open without a token) is refused here too, exit 2: render's plan is
      // what run would start, and run starts nothing for it. The host's files are `check`'s to look at.
      yield* preflight(c, { offline: true })
      const plan = redactPlan(yield* resolvePlan(c, nvmlWorkerEntry()))
      // on stderr as check prints them: stdout is the plan alone (render --json is read by tools)
      for (const warning of plan.warnings ?? []) yield* Console.error(`warning: ${warning}`)
      // An exit hint's pattern may be a RegExp, which JSON would print as {}: printed as its /source/flags.
      const replacer = (_k: string, v: unknown) => (v instanceof RegExp ? String(v) : v)
      yield* Console.log(json ? JSON.stringify(plan, replacer, 2) : formatPlan(plan))
    })
).pipe(
  Command.withDescription(
    "Print the engine command, env, URLs and probe the agent would use, without starting anything"
  ),
  Command.withExamples([
    { command: "cgn-agent render --config examples/prod.toml", description: "Show the vLLM command line" },
    { command: "cgn-agent render --config examples/prod.toml --json", description: "The same plan as JSON" }
  ])
)
