// Logs: every line the agent writes has one shape, `{ts, level, msg, ...flat fields}`; engine output lines
// are `{msg, engine, stream, run}`; `--log-level` on the command line wins over CGN_LOG_LEVEL and the config,
// and at debug the engine probes and admission decisions show. The e2e case runs the built agent
// (`dist/main.js run`) with the simulator and parses every line it wrote, stdout and stderr.
import { Console, Effect, Logger } from "effect"
import { createChannel, createClient } from "nice-grpc"
import { afterAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import * as Logging from "../../src/layers/observability/Logging.ts"
import {
  droppedLogLines,
  effectiveLevel,
  jsonLines,
  logRecord,
  MAX_LOG_BACKLOG_CHARS
} from "../../src/layers/observability/Logging.ts"
import { LogLevel } from "../../src/services/observability/LogLevel.ts"
import { killAllAgents, simAgentConfig, startAgent } from "../support/agent.ts"

afterAll(() => killAllAgents())

const date = new Date("2026-01-02T03:04:05.678Z")

describe("logRecord", () => {
  it("a text and a fields object: msg and flat fields after ts and level", () => {
    const r = logRecord({ date, level: "Info", message: ["admin HTTP listening", { url: "u", n: 2 }], annotations: {} })
    expect(JSON.stringify(r)).toBe(
      '{"ts":"2026-01-02T03:04:05.678Z","level":"info","msg":"admin HTTP listening","url":"u","n":2}'
    )
  })

  it("annotations are fields; the call's own fields win; reserved names get a trailing _", () => {
    const r = logRecord({
      date,
      level: "Warning" as never,
      message: ["x", { component: "mine", msg: "shadow" }],
      annotations: { component: "EngineProcess", engine: "vllm" }
    })
    expect(r).toEqual({
      ts: date.toISOString(),
      level: "warning",
      msg: "x",
      component: "mine",
      engine: "vllm",
      msg_: "shadow"
    })
  })

  it("errors become their message, other values join the text, a cause is a field", () => {
    const r = logRecord({
      date,
      level: "Error",
      message: ["failed", new Error("boom"), 42],
      annotations: { big: 10n },
      cause: "Error: boom\n    at x"
    })
    expect(r).toEqual({
      ts: date.toISOString(),
      level: "error",
      msg: "failed 42",
      big: "10",
      error: "boom",
      cause: "Error: boom\n    at x"
    })
  })
})

describe("a log record that cannot be written whole", () => {
  it("keeps every field that can be, the one that cannot a placeholder", () => {
    let deep: unknown = []
    for (let i = 0; i < 20_000; i++) deep = [deep]
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    const line = JSON.parse(
      Logging.toJson({ ts: "t", level: "info", msg: "m", engine: "vllm", stream: "stderr", x: deep, y: cyclic, n: 1n })
    )
    expect(line).toEqual({
      ts: "t",
      level: "info",
      msg: "m",
      engine: "vllm",
      stream: "stderr",
      x: "(not serializable)",
      y: "(not serializable)",
      n: "1"
    })
  })
})

describe("effectiveLevel", () => {
  it("the command line wins over CGN_LOG_LEVEL, which wins over the config", () => {
    expect(effectiveLevel("info", undefined)).toBe("Info")
    expect(effectiveLevel("info", "DEBUG")).toBe("Debug")
    expect(effectiveLevel("warn", "nonsense")).toBe("Warn")
    expect(effectiveLevel("info", "error", "Trace")).toBe("Trace")
  })
})

const LEVELS = new Set(["trace", "debug", "info", "warn", "warning", "error", "fatal"])

/** String values anywhere in `v` that hold a JSON object or array: JSON escaped inside a string. */
const escapedJson = (v: unknown, path = ""): Array<string> => {
  if (typeof v === "string") {
    const t = v.trim()
    if (!/^[[{][\s\S]*[\]}]$/.test(t)) return []
    try {
      JSON.parse(t)
      return [`${path}: ${v}`]
    } catch {
      return []
    }
  }
  if (typeof v === "object" && v !== null)
    return Object.entries(v).flatMap(([k, x]) => escapedJson(x, path === "" ? k : `${path}.${k}`))
  return []
}

/** What is wrong with one output line ([] when it has the one shape). */
const lineProblems = (line: string): Array<string> => {
  let v: unknown
  try {
    v = JSON.parse(line)
  } catch {
    return ["not JSON"]
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return ["not a JSON object"]
  const r = v as Record<string, unknown>
  const problems: Array<string> = []
  const keys = Object.keys(r)
  if (keys.slice(0, 3).join() !== "ts,level,msg") problems.push(`first keys ${keys.slice(0, 3).join()}`)
  if (typeof r.ts !== "string" || Number.isNaN(Date.parse(r.ts)) || !r.ts.endsWith("Z")) problems.push("ts")
  if (typeof r.level !== "string" || !LEVELS.has(r.level)) problems.push("level")
  if (typeof r.msg !== "string" || r.msg === "") problems.push("msg")
  for (const k of ["message", "annotations", "spans", "fiberId", "timestamp"]) if (k in r) problems.push(`has ${k}`)
  problems.push(...escapedJson(r).map((e) => `escaped JSON in ${e}`))
  if ("stream" in r) {
    if (r.stream !== "stdout" && r.stream !== "stderr") problems.push("stream")
    if (r.engine !== "vllm") problems.push("engine line without engine")
    if (typeof r.run !== "number") problems.push("engine line: run is not a number")
  }
  return problems
}

describe("a stderr reader that stalls (bytes written and not read)", () => {
  it("past the bound lines are dropped and counted; the next line written is preceded by the count", () => {
    const written: Array<Record<string, unknown>> = []
    const console: Console.Console = Object.assign(Object.create(globalThis.console), {
      error: (line: string) => written.push(JSON.parse(line))
    })
    let backlog = 0
    const logger = jsonLines(() => "Info", { chars: () => backlog, caughtUp: () => undefined })
    const log = (msg: string) =>
      Effect.runSync(
        Effect.logInfo(msg).pipe(
          Effect.provide(Logger.layer([logger])),
          Effect.provideService(Console.Console, console)
        )
      )
    // README: at most 1 Mi characters of lines waits for the reader
    expect(MAX_LOG_BACKLOG_CHARS).toBe(1024 * 1024)
    const before = droppedLogLines()
    log("one")
    backlog = MAX_LOG_BACKLOG_CHARS + 1
    log("two")
    log("three")
    expect(written.map((l) => l.msg)).toEqual(["one"])
    expect(droppedLogLines() - before).toBe(2)
    backlog = MAX_LOG_BACKLOG_CHARS
    log("four")
    expect(written.map((l) => [l.level, l.msg, l.dropped])).toEqual([
      ["info", "one", undefined],
      ["warn", "log: lines dropped, stderr was not being read", 2],
      ["info", "four", undefined]
    ])
    log("five")
    expect(written.at(-1)?.msg).toBe("five")
    expect(written).toHaveLength(4)
  })

  // README: "once the reader catches up a warning says how many", not only before the agent's next line (a quiet
  // agent at info may write none for hours; seen in an audit: the warning came with a POST /cordon's line).
  it("the count is written as soon as the reader has caught up, once however many lines were dropped", () => {
    const written: Array<Record<string, unknown>> = []
    const console: Console.Console = Object.assign(Object.create(globalThis.console), {
      error: (line: string) => written.push(JSON.parse(line))
    })
    let backlog = 0
    const waiting: Array<(write: (line: string) => void) => void> = []
    const logger = jsonLines(() => "Info", { chars: () => backlog, caughtUp: (then) => waiting.push(then) })
    const log = (msg: string) =>
      Effect.runSync(
        Effect.logInfo(msg).pipe(
          Effect.provide(Logger.layer([logger])),
          Effect.provideService(Console.Console, console)
        )
      )
    backlog = MAX_LOG_BACKLOG_CHARS + 1
    for (let i = 0; i < 5; i++) log(`dropped ${i}`)
    expect(waiting).toHaveLength(1) // one wait for the reader, not one per dropped line
    backlog = 0
    const afterDrain: Array<string> = []
    waiting[0]?.((line) => afterDrain.push(line))
    expect(afterDrain.map((l) => JSON.parse(l) as Record<string, unknown>)).toEqual([
      expect.objectContaining({ level: "warn", msg: "log: lines dropped, stderr was not being read", dropped: 5 })
    ])
    log("next")
    expect(written.map((l) => l.msg)).toEqual(["next"]) // said once: the next line carries no second warning
    // a later stall waits for the reader again
    backlog = MAX_LOG_BACKLOG_CHARS + 1
    log("dropped again")
    expect(waiting).toHaveLength(2)
    // The count of dropped lines is the process's (stderr is): the reader catches up, so that no warning is left
    // pending for the next file this worker runs.
    backlog = 0
    const drained: Array<string> = []
    waiting[1]?.((line) => drained.push(line))
    expect(drained).toHaveLength(1)
  })
})

describe("the LogLevel service (what SIGHUP moves)", () => {
  const run = (flag: "Warn" | undefined, next: "debug" | "error") =>
    Effect.runPromise(
      Effect.gen(function* () {
        const control = yield* LogLevel
        const before = yield* control.current
        const after = yield* control.configure(next)
        return { before, after }
      }).pipe(Effect.provide(Logging.layer("info", flag)))
    )
  it("a new [agent].log_level moves the threshold; --log-level pins it and says so", async () => {
    const saved = process.env.CGN_LOG_LEVEL
    delete process.env.CGN_LOG_LEVEL
    try {
      expect(await run(undefined, "debug")).toEqual({ before: "Info", after: { level: "Debug" } })
      expect(await run("Warn", "error")).toEqual({ before: "Warn", after: { level: "Warn", pinnedBy: "--log-level" } })
    } finally {
      if (saved !== undefined) process.env.CGN_LOG_LEVEL = saved
    }
  })
})

describe("the log lines of a real run", () => {
  it("every line dist/main.js run writes has the one shape; --log-level debug beats CGN_LOG_LEVEL", {
    timeout: 120_000
  }, async () => {
    const { config } = await simAgentConfig({ nodeId: "logs-1" })
    const agent = await startAgent({
      config,
      args: ["--log-level", "debug"],
      env: { CGN_LOG_LEVEL: "error" },
      readyTimeoutMs: 60_000
    })
    const channel = createChannel(agent.grpcAddress)
    try {
      const client = createClient(AgentDefinition, channel)
      for await (const _ of client.generate({ requestId: "logs", prompt: "a b c", sampling: { maxTokens: 3 } })) {
        // drain the stream
      }
      expect((await fetch(`${agent.adminUrl}/metrics`)).status).toBe(200)
    } finally {
      channel.close()
    }
    expect(await agent.stop("SIGTERM", 30_000)).toEqual({ code: 0, signal: null })

    const lines = [...agent.stderrLines, ...agent.stdoutLines].filter((l) => l.trim() !== "")
    expect(agent.stdoutLines.filter((l) => l.trim() !== "")).toEqual([])
    const bad = lines.flatMap((l) => {
      const p = lineProblems(l)
      return p.length === 0 ? [] : [`${p.join("; ")}: ${l}`]
    })
    expect(bad).toEqual([])

    const records = lines.map((l) => JSON.parse(l) as Record<string, unknown>)
    const engineLines = records.filter((r) => "stream" in r)
    expect(engineLines.length, agent.tail()).toBeGreaterThan(0)
    const msgs = new Set(records.map((r) => r.msg))
    // Debug level reached the daemon: the flag won over CGN_LOG_LEVEL=error.
    expect(msgs).toContain("engine readiness probe")
    expect(msgs).toContain("cgn-agent serving")
    expect(records.find((r) => r.msg === "engine Starting -> Ready")).toMatchObject({ engine: "vllm", run: 0 })
  })
})
