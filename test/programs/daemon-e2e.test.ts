// The built agent (`node dist/main.js run`) as operators meet it. SIGHUP reloads and never kills, in every mode
// (Node's default for SIGHUP is to terminate at once: no drain, no lease revoke; before the fix only a TLS agent
// had a handler): after any number of SIGHUPs the agent keeps serving, and SIGTERM still drains it to exit 0.
// An engine command that does not exist is reported as failing (/readyz, metric) while it is still retried.
// Requires dist/ (`npm run build`; `npm test` builds first).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { parse as parseToml, stringify as stringifyToml } from "smol-toml"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { awaitEngineFailing, killAllAgents, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"
import { makeTestPki } from "../support/certs.ts"
import { startMtlsEtcd } from "../support/etcd.ts"
import { agentClient, generate, grpcCode } from "../support/generate.ts"
import { pollUntil } from "../support/poll.ts"

beforeAll(() => requireDist())
afterEach(() => killAllAgents())
afterAll(() => killAllAgents())

describe("SIGHUP", () => {
  it("without TLS: the agent reloads, keeps serving, then drains on SIGTERM with exit 0", async () => {
    const { config } = await simAgentConfig()
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const reloads = () => agent.stderrLines.filter((l) => l.includes("SIGHUP: no certificates to reload")).length
    const died = agent.exited.then((e) => {
      throw new Error(`the agent died after SIGHUP (${JSON.stringify(e)}):\n${agent.tail()}`)
    })
    died.catch(() => {})
    for (let i = 1; i <= 3; i++) {
      process.kill(agent.pid, "SIGHUP")
      await Promise.race([pollUntil(`reload ${i} logged`, () => reloads() >= i || undefined, 10_000), died])
    }
    const ready = await fetch(`${agent.adminUrl}/readyz`)
    expect(ready.status, agent.tail()).toBe(200)
    const exit = await agent.stop("SIGTERM")
    expect(exit, agent.tail()).toEqual({ code: 0, signal: null })
    expect(agent.stderrLines.some((l) => l.includes("drain: started"))).toBe(true)
  }, 90_000)
})

describe("SIGHUP and the etcd client certificate", () => {
  it("a pair etcd refuses, fixed on disk: SIGHUP takes it and the agent registers, no restart", async () => {
    const pki = makeTestPki()
    const etcd = await startMtlsEtcd(pki)
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-etcd-sighup-"))
    try {
      // a client pair signed by a CA etcd does not trust: a rotation gone wrong
      const cert = path.join(dir, "client.crt")
      const key = path.join(dir, "client.key")
      fs.copyFileSync(pki.otherClient.certFile, cert)
      fs.copyFileSync(pki.otherClient.keyFile, key)
      const { config } = await simAgentConfig({
        etcd: [etcd.endpoint],
        cluster: { etcd_ca_file: pki.ca.certFile, etcd_cert_file: cert, etcd_key_file: key },
        agent: { heartbeat: "500ms", lease_ttl: "2s" }
      })
      const agent = await startAgent({ config, awaitReady: false })
      const registration = async () =>
        ((await (await fetch(`${agent.adminUrl}/status`)).json()) as { registration?: { state?: string } }).registration
          ?.state
      await pollUntil("refused by etcd", async () => ((await registration()) === "retrying" ? true : undefined), 20_000)
      fs.copyFileSync(pki.client.certFile, cert)
      fs.copyFileSync(pki.client.keyFile, key)
      process.kill(agent.pid, "SIGHUP")
      await pollUntil(
        "registered after SIGHUP",
        async () => ((await registration()) === "registered" ? true : undefined),
        20_000
      ).catch((e) => {
        throw new Error(`${(e as Error).message}\n${agent.tail()}`)
      })
      expect(agent.stderrLines.some((l) => l.includes("SIGHUP: etcd TLS files reloaded"))).toBe(true)
      expect(await agent.stop("SIGTERM")).toEqual({ code: 0, signal: null })
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
      await etcd.dispose()
      pki.cleanup()
    }
  }, 90_000)
})

describe("SIGHUP and the log level", () => {
  it("re-reads [agent].log_level: info -> debug without a restart", async () => {
    const { config, grpcPort } = await simAgentConfig({ agent: { log_level: "info" } })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    const debugLines = () => agent.logs().filter((l) => l.level === "debug")
    try {
      expect((await generate(client, { prompt: "a b c", sampling: { maxTokens: 4 } }).done).error).toBeUndefined()
      // an admitted call logs its admission at debug: at info nothing of it is written
      expect(debugLines()).toEqual([])

      const file = fs.readFileSync(agent.configPath, "utf8")
      fs.writeFileSync(agent.configPath, file.replace(/log_level = "info"/, 'log_level = "debug"'))
      process.kill(agent.pid, "SIGHUP")
      await pollUntil(
        "the new level logged",
        () => agent.logs().some((l) => l.msg === "SIGHUP: log level info -> debug"),
        30_000
      )
      expect((await generate(client, { prompt: "a b c", sampling: { maxTokens: 4 } }).done).error).toBeUndefined()
      await pollUntil("debug lines", () => debugLines().length > 0, 30_000)

      // A key a SIGHUP does not apply is named, once, as left for the next start (the log level alone was not).
      const later = (l: Record<string, unknown>) => String(l.msg).includes("effect at the agent's next start")
      const edited = parseToml(fs.readFileSync(agent.configPath, "utf8")) as { agent: Record<string, unknown> }
      fs.writeFileSync(agent.configPath, stringifyToml({ ...edited, agent: { ...edited.agent, max_inflight: 7 } }))
      process.kill(agent.pid, "SIGHUP")
      await pollUntil("the unapplied change named", () => agent.logs().some(later), 30_000)
      const notices = agent.logs().filter(later)
      expect(notices.map((l) => [l.level, l.msg])).toEqual([
        [
          "warn",
          `SIGHUP: a change to agent.max_inflight in ${agent.configPath} takes effect at the agent's next start (a SIGHUP applies agent.log_level and re-reads the TLS files only; an engine restart keeps the running config)`
        ]
      ])

      // A file that decodes but that a start would refuse (admin off loopback without a token: exit 2) is not taken:
      // its log level is not applied, nor its other changes promised for a start that would not come.
      fs.writeFileSync(
        agent.configPath,
        stringifyToml({ ...edited, agent: { ...edited.agent, log_level: "warn", listen_admin: "0.0.0.0:1" } })
      )
      process.kill(agent.pid, "SIGHUP")
      const refused = (l: Record<string, unknown>) => String(l.msg).includes("would be refused at the next start")
      await pollUntil("the refusal said", () => agent.logs().some(refused), 30_000)
      expect(JSON.stringify(agent.logs().find(refused)?.problems)).toContain("admin_token")
      expect(agent.logs().some((l) => String(l.msg).startsWith("SIGHUP: log level debug -> warn"))).toBe(false)

      // A file that no longer decodes keeps the level, and says which (its own field, not the line's `level`).
      fs.writeFileSync(agent.configPath, "[agent\n")
      process.kill(agent.pid, "SIGHUP")
      const invalid = (l: Record<string, unknown>) => String(l.msg).startsWith("SIGHUP: the config file is invalid")
      await pollUntil("the invalid file said", () => agent.logs().some(invalid), 30_000)
      const line = agent.logs().find(invalid)
      expect(line).toMatchObject({ level: "warn", log_level: "debug" })
      expect(line).not.toHaveProperty("level_")
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 90_000)

  it("an edit CGN_LOG_LEVEL overrides is said at warn, which the pinned level writes (at info it was silent)", async () => {
    const { config } = await simAgentConfig({ agent: { log_level: "info" } })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000, env: { CGN_LOG_LEVEL: "warn" } })
    try {
      const file = fs.readFileSync(agent.configPath, "utf8")
      fs.writeFileSync(agent.configPath, file.replace(/log_level = "info"/, 'log_level = "debug"'))
      process.kill(agent.pid, "SIGHUP")
      const said = (l: Record<string, unknown>) => String(l.msg).startsWith("SIGHUP: agent.log_level")
      await pollUntil("the override said", () => agent.logs().some(said), 30_000)
      expect(
        agent
          .logs()
          .filter(said)
          .map((l) => [l.level, l.msg])
      ).toEqual([
        ["warn", 'SIGHUP: agent.log_level = "debug" not applied: the log level stays warn (set by CGN_LOG_LEVEL)']
      ])
      expect(agent.logs().some((l) => l.level === "debug" || l.level === "info")).toBe(false)
    } finally {
      expect((await agent.stop()).code).toBe(0)
    }
  }, 90_000)
})

describe("an engine command that does not exist", () => {
  it("is shown as failing (/readyz reason, cgn_agent_engine_failing) while the restarts go on", async () => {
    const { config } = await simAgentConfig({
      engine: {
        command: ["/nonexistent/engine-binary"],
        restart_backoff_initial: "100ms",
        restart_backoff_max: "500ms"
      }
    })
    const agent = await startAgent({ config, awaitReady: false })
    const readyz = await awaitEngineFailing(agent)
    expect(readyz).toMatch(/^unhealthy \(engine (restarting|starting): engine failing: \d+ runs in a row/)
    expect(readyz).toContain("ENOENT")
    const metric = async (name: string) => {
      const body = await (await fetch(`${agent.adminUrl}/metrics`)).text()
      const line = body.split("\n").find((l) => l.startsWith(`${name} `))
      return line === undefined ? undefined : Number(line.split(" ")[1])
    }
    expect(await metric("cgn_agent_engine_failing")).toBe(1)
    const before = (await metric("cgn_agent_engine_restarts_total")) ?? 0
    await pollUntil(
      "more restarts",
      async () => ((await metric("cgn_agent_engine_restarts_total")) ?? 0) > before,
      20_000
    )
    const exit = await agent.stop("SIGTERM")
    expect(exit, agent.tail()).toEqual({ code: 0, signal: null })
  }, 120_000)
})

describe("a stalled engine", () => {
  // The simulator stops sending after 3 tokens but keeps the connection open: only engine.stream_idle_timeout
  // ends the call. Once it has, and no call has completed since, the node is unhealthy with the reason, until a
  // call completes again: with none coming, the agent's own test completion.
  it("ends the stalled call UNAVAILABLE, then /readyz says the engine stalled until a call completes", async () => {
    const { config, engineUrl, grpcPort } = await simAgentConfig({ engine: { stream_idle_timeout: "500ms" } })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    const faults = (f: Record<string, unknown>) =>
      fetch(`${engineUrl}/sim/faults`, { method: "POST", body: JSON.stringify(f) }).then((r) =>
        expect(r.status).toBe(200)
      )
    try {
      await faults({ stallAfterTokens: 3 })
      // the simulator echoes the prompt: 40 words, so the stall after 3 tokens comes mid-answer
      const prompt = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ")
      const stalled = await generate(client, { prompt, sampling: { maxTokens: 50 } }).done
      expect(grpcCode(stalled.error), JSON.stringify({ final: stalled.final, tokens: stalled.tokens() })).toBe(
        "UNAVAILABLE"
      )
      const readyz = await pollUntil(
        "/readyz says the engine stalled",
        async () => {
          const res = await fetch(`${agent.adminUrl}/readyz`)
          const text = await res.text()
          return res.status === 503 && text.includes("engine stalled") ? text : undefined
        },
        30_000
      )
      expect(readyz).toMatch(/^unhealthy \(engine ready: engine stalled: 1 stream\(s\) sent nothing for /)
      const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as { health: { state: string } }
      expect(status.health.state).toBe("unhealthy")

      // stalled and idle, the agent asks the engine for a test completion, which the stalling engine fails too
      await agent.waitForLine((l) => l.includes("the engine failed a test request sent with no call in flight"), 30_000)
      expect((await fetch(`${agent.adminUrl}/readyz`)).status).toBe(503)

      // the engine recovers: with no call coming, the next test completion clears it
      await faults({ stallAfterTokens: null })
      await pollUntil("ready again", async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200, 30_000)
      await agent.waitForLine(
        (l) =>
          l.includes(
            "the engine is no longer stalled: the engine completed a test request sent with no call in flight"
          ),
        1_000
      )
      const ok = await generate(client, { prompt, sampling: { maxTokens: 40 } }).done
      expect(ok.error).toBeUndefined()
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)

  // A wedged engine that still answers its health endpoint: liveness never ends it, stall_restart_after does.
  it("restarts an engine still stalled after engine.stall_restart_after, and the new run serves", async () => {
    const { config, engineUrl, grpcPort } = await simAgentConfig({
      engine: { stream_idle_timeout: "500ms", stall_restart_after: "1s", restart_backoff_initial: "100ms" }
    })
    const agent = await startAgent({ config, readyTimeoutMs: 45_000 })
    const { client, channel } = agentClient(`127.0.0.1:${grpcPort}`)
    try {
      const res = await fetch(`${engineUrl}/sim/faults`, {
        method: "POST",
        body: JSON.stringify({ stallAfterTokens: 3 })
      })
      expect(res.status).toBe(200)
      const prompt = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ")
      expect(grpcCode((await generate(client, { prompt, sampling: { maxTokens: 50 } }).done).error)).toBe("UNAVAILABLE")
      const exit = await pollUntil(
        "the stalled run's exit in /status",
        async () => {
          const status = (await (await fetch(`${agent.adminUrl}/status`)).json()) as {
            engine: { exits: ReadonlyArray<{ run: number; reason: string }> }
          }
          return status.engine.exits[0]
        },
        30_000
      )
      expect(exit.run).toBe(0)
      expect(exit.reason).toMatch(
        /^restarted: engine stalled: 1 stream\(s\) sent nothing for 500ms .*, for 1s \(engine.stall_restart_after\)$/
      )
      // the new run is a fresh simulator, without the fault: ready, and it serves
      await pollUntil("ready again", async () => (await fetch(`${agent.adminUrl}/readyz`)).status === 200, 45_000)
      const ok = await generate(client, { prompt, sampling: { maxTokens: 40 } }).done
      expect(ok.error).toBeUndefined()
      const metrics = await (await fetch(`${agent.adminUrl}/metrics`)).text()
      expect(metrics).toMatch(/^cgn_agent_engine_restarts_total 1$/m)
      expect(metrics).toMatch(/^cgn_agent_engine_restart_requests_total\{source="stall"\} 1$/m)
    } finally {
      channel.close()
    }
    expect((await agent.stop()).code).toBe(0)
  }, 120_000)
})
