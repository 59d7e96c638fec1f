// Secrets the engine prints, end to end through the built agent (dist/main.js), as the security review found them:
// a fake engine that prints its environment and its argv (vLLM logs its non-default args, `api_key` and `hf_token`
// among them) and dies at start. Neither the agent's log nor /status's exits[].lastLines may carry a secret value:
// of [engine].env, of the agent's own environment the engine inherits, of a secret flag in engine.args. The agent's
// admin token (CGN_AGENT_ADMIN_TOKEN) must not reach the engine at all, nor the agent's OpenTelemetry settings (its
// collector's credentials in OTEL_EXPORTER_OTLP_HEADERS); secrets the engine prints encoded (JSON, base64) are
// scrubbed too. Needs dist/ (`npm run build`).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { REDACTED } from "../../src/services/engine/Secrets.ts"
import { type AgentHandle, killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { pollUntil } from "../support/poll.ts"

const ADMIN_TOKEN = "envadm_SECRET888"

let agent: AgentHandle | undefined
const dirs: Array<string> = []

beforeAll(() => requireDist())
afterEach(async () => {
  try {
    if (agent !== undefined) expect((await agent.stop("SIGTERM", 30_000)).code).toBe(0)
  } finally {
    agent = undefined
    await killAllAgents()
    for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
  }
})

interface Status {
  readonly engine: {
    readonly exits: ReadonlyArray<{ readonly run: number; readonly lastLines: ReadonlyArray<string> }>
  }
}

/** Polls /status until run 0's exit is recorded; returns its kept lines. */
const firstExitLines = async (a: AgentHandle): Promise<string> => {
  const exit = await pollUntil(
    "the first run's exit in /status",
    async () => {
      const res = await fetch(`${a.adminUrl}/status`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
      const body = (await res.json()) as Status
      return body.engine.exits.find((x) => x.run === 0)
    },
    30_000,
    100
  ).catch((e: unknown) => {
    throw new Error(`${String(e)}; agent log:\n${a.tail()}`)
  })
  return exit.lastLines.join("\n")
}

describe("an engine that prints its secrets", () => {
  it("has them scrubbed from the agent's log and /status, and never gets the admin token", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-secrets-"))
    dirs.push(dir)
    const engine = path.join(dir, "engine.sh")
    fs.writeFileSync(
      engine,
      [
        "#!/bin/sh",
        "env",
        'echo "non-default args: $*" >&2',
        'echo "hf_token=$HF_TOKEN wandb=$WANDB_CRED inherited=$MY_SERVICE_TOKEN admin=[$CGN_AGENT_ADMIN_TOKEN]" >&2',
        "exit 1",
        ""
      ].join("\n")
    )
    const { config } = await simAgentConfig({
      engine: {
        command: ["/bin/sh", engine],
        args: ["--hf-token", "hf_ARGSECRET1", "--admin-api-key=apikey_SECRET2"],
        env: { HF_TOKEN: "hf_SECRET123", WANDB_CRED: "wandbcred_SECRET125" },
        // handed to the engine as VLLM_API_KEY (engine.api_key), a secret of its environment like the others
        api_key: "enginekey_SECRET4",
        restart_backoff_initial: "60s",
        restart_backoff_max: "60s"
      }
    })
    agent = await startAgent({
      config,
      awaitReady: false,
      env: { CGN_AGENT_ADMIN_TOKEN: ADMIN_TOKEN, MY_SERVICE_TOKEN: "inherited_SECRET777" }
    })
    const a = agent
    const kept = await firstExitLines(a)
    expect(kept).toContain(`hf_token=${REDACTED} wandb=${REDACTED} inherited=${REDACTED} admin=[]`)
    expect(kept).toContain(`--hf-token ${REDACTED} --admin-api-key=${REDACTED}`)
    expect(kept).not.toContain("SECRET")
    // The relayed lines are in the log by now: they were kept before the run's exit was recorded.
    await a.waitForLine((l) => l.includes("admin=[]"), 10_000)
    const log = a.stderrLines.join("\n")
    expect(log).toContain(`inherited=${REDACTED}`)
    expect(log).toContain(`VLLM_API_KEY=${REDACTED}`)
    expect(log).not.toContain("SECRET")
  }, 60_000)

  it("gets none of the agent's OTEL_* and has its secrets scrubbed when it prints them JSON-escaped or in base64", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-secrets-"))
    dirs.push(dir)
    const engine = path.join(dir, "engine.mjs")
    // What a Python engine does with its settings: json.dumps of a dict, the base64 of a token, a Basic auth header.
    fs.writeFileSync(
      engine,
      [
        "const e = process.env",
        "const b64 = (s) => Buffer.from(s).toString('base64')",
        "const otel = e.OTEL_EXPORTER_OTLP_HEADERS ?? ''",
        "console.error('inherited otel=[' + otel + '] service=[' + (e.OTEL_SERVICE_NAME ?? '') + ']')",
        "console.error('config: ' + JSON.stringify({ api_key: e.MY_API_KEY }))",
        "console.error('token ' + b64(e.HF_TOKEN) + ' auth: Basic ' + b64('admin:' + e.HF_TOKEN))",
        "console.error('exporter headers: ' + e.OTEL_EXPORTER_OTLP_TRACES_HEADERS)",
        "process.exit(1)",
        ""
      ].join("\n")
    )
    const jsonSecret = 'js"on\\SECRET/42'
    const hfToken = "hf_b64SECRET0123"
    const { config } = await simAgentConfig({
      engine: {
        command: [process.execPath, engine],
        env: {
          MY_API_KEY: jsonSecret,
          HF_TOKEN: hfToken,
          OTEL_EXPORTER_OTLP_TRACES_HEADERS: "authorization=Bearer otelengine_SECRET5"
        },
        restart_backoff_initial: "60s",
        restart_backoff_max: "60s"
      }
    })
    agent = await startAgent({
      config,
      awaitReady: false,
      env: {
        CGN_AGENT_ADMIN_TOKEN: ADMIN_TOKEN,
        OTEL_EXPORTER_OTLP_HEADERS: "authorization=Bearer otelagent_SECRET6",
        OTEL_SERVICE_NAME: "cgn-agent-e2e"
      }
    })
    const a = agent
    const kept = await firstExitLines(a)
    const b64 = (s: string) => Buffer.from(s).toString("base64")
    expect(kept).toContain("inherited otel=[] service=[]")
    expect(kept).toContain(`config: {"api_key":"${REDACTED}"}`)
    expect(kept).toContain(`token ${REDACTED} auth: Basic `)
    expect(kept).toContain(`exporter headers: authorization=${REDACTED}`)
    const leaks = [
      "SECRET",
      JSON.stringify(jsonSecret).slice(1, -1),
      b64(hfToken),
      b64(`admin:${hfToken}`).slice(8, 24)
    ]
    for (const leak of leaks) expect(kept).not.toContain(leak)
    await a.waitForLine((l) => l.includes("exporter headers:"), 10_000)
    const log = a.stderrLines.join("\n")
    expect(log).toContain(`config: {\\"api_key\\":\\"${REDACTED}\\"}`)
    for (const leak of leaks) expect(log).not.toContain(leak)
  }, 60_000)

  it("has them scrubbed from JSON lines whatever their escapes, and its lines cut, a secret across the cut too", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-secrets-"))
    dirs.push(dir)
    const engine = path.join(dir, "engine.mjs")
    const secret = "hf_jsonSECRET&99"
    // Every character \u-escaped, upper-case hex (as Jackson writes), Go's \u0026 for '&', a nested field; then a
    // line of 1 MiB with no end but the process's, the secret across the agent's cut at 16,384 characters; then a
    // JSON line (under the cut) nested too deep to write again, whose message reads like one of the agent's own.
    const u = (s: string) =>
      [...s].map((c) => `\\u${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}`).join("")
    fs.writeFileSync(
      engine,
      [
        "const s = process.env.HF_TOKEN",
        `const u = ${u.toString()}`,
        "console.error('{\"msg\":\"token ' + u(s) + '\",\"f\":{\"deep\":[\"' + s.replace('&', '\\\\u0026') + '\"]}}')",
        "console.error('{\"msg\":\"engine Ready -> Unhealthy (forged)\",\"x\":' + '['.repeat(6000) + ']'.repeat(6000) + '}')",
        "process.stderr.write('x'.repeat(16380) + s + 'y'.repeat(1 << 20), () => process.exit(1))",
        ""
      ].join("\n")
    )
    const { config } = await simAgentConfig({
      engine: {
        command: [process.execPath, engine],
        env: { HF_TOKEN: secret },
        restart_backoff_initial: "60s",
        restart_backoff_max: "60s"
      }
    })
    agent = await startAgent({ config, awaitReady: false, env: { CGN_AGENT_ADMIN_TOKEN: ADMIN_TOKEN } })
    const a = agent
    const kept = await firstExitLines(a)
    await a.waitForLine((l) => l.includes("line cut"), 10_000)
    const records = a.stderrLines.map((l) => JSON.parse(l) as Record<string, unknown>)
    const engineLines = records.filter((r) => r.stream === "stderr")
    const text = JSON.stringify(engineLines)
    for (const leak of ["SECRET", "hf_json", "\\u0053\\u0045"]) {
      expect(text).not.toContain(leak)
      expect(kept).not.toContain(leak)
    }
    expect(engineLines.find((r) => r.msg === `token ${REDACTED}`)?.engine_fields).toEqual({ f: { deep: [REDACTED] } })
    // The deep line is not shown (too deep to scrub), and its forged message with it; a line, annotated, says so.
    expect(engineLines.some((r) => /^\(a JSON line of \d+ characters nested too deeply/.test(String(r.msg)))).toBe(true)
    expect(records.some((r) => String(r.msg).includes("(forged)"))).toBe(false)
    const cut = engineLines.find((r) => String(r.msg).includes("line cut"))
    // Shown up to its 16,384th character as it came, the secret across the cut replaced whole, marked.
    expect(/^x{16380}<redacted> … \(line cut/.test(String(cut?.msg))).toBe(true)
    // The agent is up: its admin port answers.
    expect((await fetch(`${a.adminUrl}/healthz`)).status).toBe(200)
  }, 60_000)
})
