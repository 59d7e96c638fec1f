// EngineProcess against the engine simulator as a real subprocess: readiness per flavor (mlx by a completion),
// crash -> restart with growing backoff, stall -> Unhealthy -> restart, the kill sequence (TERM-ignoring engine,
// forked grandchild), no orphans when the agent itself is SIGKILLed, the pid-file reclaim of a stale engine,
// refusal on a foreign listener, and openai_compat (no process, same state machine).
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as http from "node:http"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Context, Effect, Exit, Fiber, Layer, Logger, Result, Scope, Stream } from "effect"
import { afterEach, assert, describe, it } from "vitest"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import * as EngineHostLive from "../../src/layers/engine/EngineHost.ts"
import { planLayer } from "../../src/layers/engine/EnginePlan.ts"
import * as EngineProcessLive from "../../src/layers/engine/EngineProcess.ts"
import { layerFromPlan, type SupervisorSettings, settingsFromConfig } from "../../src/layers/engine/EngineProcess.ts"
import { type PidRecord, pidFilePath, readPidFile, writePidFile } from "../../src/layers/engine/pidFile.ts"
import { groupAlive, pidAlive, processExe, processStartMs } from "../../src/layers/engine/processGroup.ts"
import { holdStateDir, LEFTOVER_MS, lockFilePath } from "../../src/layers/stateDir/stateLock.ts"
import { guardEntry } from "../../src/programs/programPaths.ts"
import type { EngineKind } from "../../src/services/config/Config.ts"
import type { LaunchPlan } from "../../src/services/engine/Engine.ts"
import { EngineProcess, type EngineProcessService, type EngineState } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import { decodeLock, HEARTBEAT_STALE_MS, type LockRecord } from "../../src/services/stateDir/LockVerdict.ts"
import * as EngineProcessLayer from "../../src/testing/EngineProcess.ts"
import { pollUntil } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { type SimHandle, simEntry, startSim } from "../support/sim.ts"

const here = path.dirname(fileURLToPath(import.meta.url))
/** The live host, spawning through the guard program as the daemon does (programs/main.ts). */
const liveHost = EngineHostLive.layer(guardEntry())
/** The pid file's record now (the test reads it outside any Effect). */
const pidRecord = (stateDir: string) => Effect.runPromise(readPidFile(pidFilePath(stateDir)))
const writeRecord = (stateDir: string, record: PidRecord) =>
  Effect.runPromise(writePidFile(pidFilePath(stateDir), record))
const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const tmpDir = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-ep-"))
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }))
  return dir
}

/** The shared bounded poll with this file's longer default (supervisor restarts take seconds). */
const waitFor = <A>(what: string, probe: () => A | undefined | false, ms = 15_000): Promise<A> =>
  pollUntil(what, probe, ms, 20)

interface Setup {
  readonly plan: LaunchPlan
  readonly settings: SupervisorSettings
  readonly port: number
  readonly stateDir: string
}

/** A rendered plan whose executable is the simulator (`[engine].command`), with short test durations. */
const setup = async (
  kind: EngineKind,
  options: {
    knobs?: ReadonlyArray<string>
    engine?: Record<string, unknown>
    /** Probe GET /health (which --sim-hang-health stalls) instead of the rendered /v1/models. */
    healthProbe?: boolean
    port?: number
  } = {}
): Promise<Setup> => {
  const port = options.port ?? (await freePort())
  const stateDir = tmpDir()
  const raw = {
    agent: {
      state_dir: stateDir,
      ...(options.healthProbe ? { ready_probe_url: `http://127.0.0.1:${port}/health` } : {})
    },
    engine: {
      kind,
      url: `http://127.0.0.1:${port}`,
      ...(kind === "openai_compat"
        ? {}
        : { command: [process.execPath, simEntry], args: ["--flavor", kind, ...(options.knobs ?? [])] }),
      startup_timeout: "20s",
      stop_grace: "500ms",
      liveness_interval: "200ms",
      liveness_failures: 3,
      restart_backoff_initial: "100ms",
      restart_backoff_max: "2s",
      restart_stable_after: "10m",
      ...options.engine
    },
    models: { m: { hf_repo: "org/m" } }
  }
  const decoded = decodeConfigObject(raw, undefined)
  if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
  const config = decoded.success
  const settings = { ...settingsFromConfig(config), probeIntervalMs: 100 }
  return { plan: engineFor(kind).render(config), settings, port, stateDir }
}

interface Harness {
  readonly engine: EngineProcessService
  /** Every state published so far, in order. */
  readonly states: Array<EngineState>
  readonly logs: Array<string>
  close(): Promise<void>
}

const quietLogger = (logs: Array<string>) =>
  Logger.layer([
    Logger.make(({ logLevel, message }) =>
      logs.push(
        `${logLevel} ${[message]
          .flat()
          .map((m) => (typeof m === "string" ? m : JSON.stringify(m)))
          .join(" ")}`
      )
    )
  ])

const build = async (plan: LaunchPlan, settings: SupervisorSettings) => {
  const logs: Array<string> = []
  const scope = Effect.runSync(Scope.make())
  const exit = await Effect.runPromiseExit(
    Layer.buildWithScope(
      layerFromPlan(plan, settings).pipe(Layer.provide(liveHost), Layer.provide(quietLogger(logs))),
      scope
    )
  )
  return { exit, scope, logs }
}

const start = async (plan: LaunchPlan, settings: SupervisorSettings): Promise<Harness> => {
  const { exit, scope, logs } = await build(plan, settings)
  if (Exit.isFailure(exit)) throw new Error(`layer failed: ${String(exit.cause)}`)
  const engine = Context.get(exit.value, EngineProcess)
  const states: Array<EngineState> = []
  Effect.runFork(engine.changes.pipe(Stream.runForEach((s) => Effect.sync(() => states.push(s)))))
  let closed: Promise<void> | undefined
  const close = () => (closed ??= Effect.runPromise(Scope.close(scope, Exit.void)))
  cleanups.push(close)
  return { engine, states, logs, close }
}

const current = (h: Harness) => h.states[h.states.length - 1]
const awaitState = (h: Harness, what: string, pred: (s: EngineState) => boolean, ms?: number) =>
  waitFor(what, () => h.states.find(pred), ms)

const simState = async (port: number): Promise<{ pid: number; grandchildPid: number | null; healthChecks: number }> => {
  const res = await fetch(`http://127.0.0.1:${port}/sim/state`)
  return (await res.json()) as { pid: number; grandchildPid: number | null; healthChecks: number }
}

const postFaults = (port: number, body: Record<string, unknown>) =>
  fetch(`http://127.0.0.1:${port}/sim/faults`, { method: "POST", body: JSON.stringify(body) }).then((r) => r.text())

describe("readiness per flavor", () => {
  for (const kind of ["vllm", "sglang", "llama_cpp", "mlx"] as const) {
    it(`${kind}: Starting -> Ready, pid file while running, Stopped with the group gone`, async () => {
      const s = await setup(kind, { knobs: ["--sim-startup-delay", "300ms"] })
      if (kind === "mlx") assert.strictEqual(s.plan.probe.kind, "completion")
      // an agent killed mid-write left its temp pid file under a random name: swept at the start
      const leftover = `${pidFilePath(s.stateDir)}.1.0123456789abcdef.tmp`
      fs.writeFileSync(leftover, "{}")
      const h = await start(s.plan, s.settings)
      await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
      assert.isFalse(fs.existsSync(leftover), "a killed agent's temp pid file swept")
      assert.strictEqual(h.states[0]?._tag, "Starting")
      assert.strictEqual(current(h)?._tag, "Ready")
      const { pid } = await simState(s.port)
      const record = await pidRecord(s.stateDir)
      assert.strictEqual(record?.pgid, pid)
      assert.strictEqual(record?.agentPid, process.pid)
      // the executable a later reclaim checks the group against (the simulator runs on node)
      assert.strictEqual(record?.exe, processExe(pid))
      assert.strictEqual(record?.exe, fs.realpathSync(process.execPath))
      assert.strictEqual(fs.statSync(pidFilePath(s.stateDir)).mode & 0o777, 0o600)

      await Effect.runPromise(h.engine.stop)
      const last = current(h)
      assert.strictEqual(last?._tag, "Stopped")
      if (last?._tag === "Stopped") assert.strictEqual(last.lastExit?.reason, "stopped")
      assert.isFalse(groupAlive(pid), "engine group gone after stop")
      assert.isFalse(fs.existsSync(pidFilePath(s.stateDir)), "pid file removed after stop")
      assert.isTrue(
        // The simulator's JSON line, relayed as msg "listening" with its other keys nested.
        h.logs.some((l) => l.startsWith("Info listening ") && l.includes('"engine_fields"')),
        "engine output is in the agent's log"
      )
    })
  }
})

/** The stand-in agent (test/fixtures/supervise.ts) supervising `s` in a process of its own; `out` is its stdout so far. */
const spawnAgent = (s: Setup) => {
  const agent: ChildProcess = spawn(
    process.execPath,
    [path.join(here, "../fixtures/supervise.ts"), JSON.stringify({ plan: s.plan, settings: s.settings })],
    { stdio: ["ignore", "pipe", "ignore"] }
  )
  cleanups.push(() => {
    if (agent.exitCode === null && agent.signalCode === null) agent.kill("SIGKILL")
  })
  let out = ""
  agent.stdout?.on("data", (c: Buffer) => {
    out += c.toString()
  })
  return { agent, out: () => out }
}

/** Builds the supervisor of `s` (success or not); its scope is closed by the test's cleanup, or by `close`. */
const tryStart = async (s: Setup) => {
  const { exit, scope, logs } = await build(s.plan, s.settings)
  let closed: Promise<void> | undefined
  const close = () => (closed ??= Effect.runPromise(Scope.close(scope, Exit.void)))
  cleanups.push(close)
  // as JSON: the error's fields (its `reason` tag too, which its message no longer shows), not only its message
  return { exit, logs, close, cause: Exit.isFailure(exit) ? JSON.stringify(exit.cause) : "the start was not refused" }
}

describe("the state dir", () => {
  // Node's recursive mkdir never settles under /proc (it spins on EEXIST/ENOENT): the start ends with procfs's own
  // answer, not the 10 s bound (layers/stateDir/makeDirs.ts).
  it("a state dir that cannot be created refuses the start with the reason and the key's advice", async () => {
    const exit = await Effect.runPromiseExit(Effect.scoped(holdStateDir(`/proc/cgn-agent-test-${process.pid}/state`)))
    if (Exit.isSuccess(exit)) return assert.fail("the start was not refused")
    const message = String(Exit.isFailure(exit) ? JSON.stringify(exit.cause) : "")
    assert.include(message, "StateDir")
    assert.include(message, `ENOENT: no such file or directory, mkdir '/proc/cgn-agent-test-${process.pid}'`)
    assert.include(message, "set agent.state_dir to a writable local directory")
    assert.notInclude(message, "no answer within")
  }, 30_000)

  it("a stop while the start waits out another namespace's lock heartbeat ends the wait at once", async () => {
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-lockwait-"))
    cleanups.push(async () => fs.rmSync(stateDir, { recursive: true, force: true }))
    const lock = lockFilePath(stateDir)
    fs.writeFileSync(lock, JSON.stringify({ pid: 7, pidNs: "pid:[1]", host: os.hostname(), token: "other" }))
    // Refreshed just now and never again: the start would wait HEARTBEAT_STALE_MS before taking it over.
    const logs: Array<string> = []
    const fiber = Effect.runFork(Effect.scoped(holdStateDir(stateDir)).pipe(Effect.provide(quietLogger(logs))))
    await waitFor("the start waiting out the lock", () => logs.some((l) => l.includes("waiting up to 15 s")), 10_000)
    const stopped = await Effect.runPromise(
      Fiber.interrupt(fiber).pipe(
        Effect.as("stopped"),
        Effect.timeoutOrElse({ duration: HEARTBEAT_STALE_MS / 3, orElse: () => Effect.succeed("still waiting") })
      )
    )
    assert.strictEqual(stopped, "stopped")
    assert.strictEqual(
      decodeLock(fs.readFileSync(lock, "utf8"))?.token,
      "other",
      "the other agent's lock is left alone"
    )
  })

  it("a live agent holding the state_dir refuses a second one (AnotherAgent, its pid and the state_dir), even between its runs; its SIGTERM releases it", async () => {
    // The first agent's engine cannot be spawned: it keeps restarting and never writes a pid record, so nothing
    // but the lock says that the state_dir is taken.
    const first = await setup("vllm", { engine: { command: ["/nonexistent/engine-binary"] } })
    const { agent, out } = spawnAgent(first)
    await waitFor("the first agent between runs", () => out().includes('"_tag":"Restarting"'), 20_000)
    const lock = lockFilePath(first.stateDir)
    assert.strictEqual(decodeLock(fs.readFileSync(lock, "utf8"))?.pid, agent.pid)
    assert.isFalse(fs.existsSync(pidFilePath(first.stateDir)), "no pid record to refuse the start by")

    const second = await setup("vllm")
    const { cause } = await tryStart({ ...second, settings: { ...second.settings, stateDir: first.stateDir } })
    assert.include(cause, "AnotherAgent")
    assert.include(cause, `agent.state_dir ${first.stateDir} is held by agent pid ${agent.pid}`)

    // SIGTERM interrupts the stand-in's main fiber, which closes the supervisor's scope: the lock goes with it.
    const exited = new Promise((r) => agent.once("exit", r))
    agent.kill("SIGTERM")
    await exited
    assert.isFalse(fs.existsSync(lock), "the lock is released when the agent stops")
    const third = await tryStart({ ...second, settings: { ...second.settings, stateDir: first.stateDir } })
    assert.isTrue(Exit.isSuccess(third.exit), third.cause)
  }, 40_000)

  it("a lock left by an agent that is gone, or naming a reused pid, is taken over; the holder's is refreshed and removed with its scope", async () => {
    // An engine that only waits: these starts are closed before it matters.
    const s = await setup("vllm", { engine: { command: [process.execPath, "-e", "setInterval(() => {}, 1000)"] } })
    const lock = lockFilePath(s.stateDir)
    const ours = { host: os.hostname(), pidNs: fs.readlinkSync("/proc/self/ns/pid"), token: "old" }
    const writeLock = (record: Partial<LockRecord>) => fs.writeFileSync(lock, JSON.stringify({ ...ours, ...record }))
    const held = () => decodeLock(fs.readFileSync(lock, "utf8"))

    const dead = spawn("true")
    await new Promise((r) => dead.once("exit", r))
    writeLock({ pid: dead.pid!, startedAt: Date.now() })
    const gone = await tryStart(s)
    assert.isTrue(Exit.isSuccess(gone.exit), gone.cause)
    assert.isTrue(
      gone.logs.some((l) => l.includes(`taking over ${lock}: agent pid ${dead.pid} is gone`)),
      gone.logs.join("\n")
    )
    assert.strictEqual(held()?.pid, process.pid)
    assert.strictEqual(held()?.startedAt, processStartMs(process.pid))
    // The heartbeat, for agents in other pid namespaces: an mtime set back is refreshed.
    fs.utimesSync(lock, new Date(2000, 0, 1), new Date(2000, 0, 1))
    await waitFor("the lock refreshed", () => Date.now() - fs.statSync(lock).mtimeMs < 60_000, 10_000)
    await gone.close()
    assert.isFalse(fs.existsSync(lock), "the lock is removed when the supervisor's scope closes")

    // Someone else's process under the pid an old lock names (as after a reboot): left alone, the lock taken.
    const bystander = spawn("sleep", ["600"], { stdio: "ignore" })
    cleanups.push(() => {
      bystander.kill("SIGKILL")
    })
    writeLock({ pid: bystander.pid!, startedAt: processStartMs(bystander.pid!)! - 3_600_000 })
    const reused = await tryStart(s)
    assert.isTrue(Exit.isSuccess(reused.exit), reused.cause)
    assert.isTrue(
      reused.logs.some((l) => l.includes("a reused pid")),
      reused.logs.join("\n")
    )
    assert.isTrue(pidAlive(bystander.pid!), "the process now under that pid is not touched")
    await reused.close()

    // Another pid namespace (a restarted container, a pod sharing a hostPath): its heartbeat says if it is alive.
    // A holder that keeps refreshing it is refused...
    writeLock({ pid: 7, pidNs: "pid:[1]" })
    const refresher = setInterval(() => fs.utimesSync(lock, new Date(), new Date()), 200)
    const fresh = await tryStart(s).finally(() => clearInterval(refresher))
    assert.include(fresh.cause, "AnotherAgent")
    assert.include(fresh.cause, "another pid namespace (pid:[1])")
    // ...and one whose refreshes stopped a moment ago (the container before this one, crashed) is waited out, not
    // refused: the start goes on once the lock has been silent for the whole heartbeat.
    const crashedAt = Date.now() - (HEARTBEAT_STALE_MS - 1_500)
    fs.utimesSync(lock, new Date(crashedAt), new Date(crashedAt))
    const restarted = await tryStart(s)
    assert.isTrue(Exit.isSuccess(restarted.exit), restarted.cause)
    assert.isTrue(
      restarted.logs.some((l) => /another pid namespace \(pid:\[1\]\), silent for 1[56] s/.test(l)),
      restarted.logs.join("\n")
    )
    await restarted.close()
    writeLock({ pid: 7, pidNs: "pid:[1]" })
    fs.utimesSync(lock, new Date(Date.now() - 60_000), new Date(Date.now() - 60_000))
    const silent = await tryStart(s)
    assert.isTrue(Exit.isSuccess(silent.exit), silent.cause)
    assert.isTrue(
      silent.logs.some((l) => /silent for \d+ s/.test(l)),
      silent.logs.join("\n")
    )
    await silent.close()

    // Contenders' own lock files that a SIGKILL left behind are removed by the next holder; a fresh one (a live
    // contender's) is not.
    const leftovers = [`${lock}.0f1e2d3c`, `${lock}.0f1e2d3c.stale`, `${lock}.fresh`]
    for (const f of leftovers) fs.writeFileSync(f, "{}")
    const old = new Date(Date.now() - LEFTOVER_MS - 5_000)
    for (const f of leftovers.slice(0, 2)) fs.utimesSync(f, old, old)
    const swept = await tryStart(s)
    assert.isTrue(Exit.isSuccess(swept.exit), swept.cause)
    assert.deepStrictEqual(
      leftovers.map((f) => fs.existsSync(f)),
      [false, false, true]
    )
    assert.isTrue(
      swept.logs.some((l) => l.includes("removed lock files left by stopped agents: agent.lock.0f1e2d3c")),
      swept.logs.join("\n")
    )
    await swept.close()
    fs.rmSync(`${lock}.fresh`)

    // Something that is not a lock file in its place (a directory, a dangling link, a file this user cannot
    // read): the start fails at once, saying so, rather than retrying it for good.
    fs.mkdirSync(lock)
    const unreadable = await tryStart(s)
    assert.include(unreadable.cause, "StateDir")
    assert.include(unreadable.cause, `cannot read ${lock}`)
    fs.rmdirSync(lock)
  }, 60_000)
})

describe("the plan's warnings", () => {
  it("are logged once at start (a valid config the backend sees a problem with, e.g. SGLang's loopback bootstrap)", async () => {
    const s = await setup("vllm", { engine: { command: [process.execPath, "-e", "setInterval(() => {}, 1000)"] } })
    const h = await start({ ...s.plan, warnings: ["the backend's advice"] }, s.settings)
    assert.strictEqual(h.logs.filter((l) => l.includes("the backend's advice")).length, 1, h.logs.join("\n"))
  })
})

describe("the engine's port", () => {
  // The engine only waits, never listens; this process takes its port once the start-up check has passed.
  const foreignListener = async (engine: Record<string, unknown>) => {
    const s = await setup("vllm", {
      engine: { command: [process.execPath, "-e", "setInterval(() => {}, 1000)"], ...engine }
    })
    const h = await start(s.plan, s.settings)
    const server = http.createServer((_req, res) => res.writeHead(200).end("{}"))
    await new Promise<void>((r) => server.listen(s.port, "127.0.0.1", r))
    cleanups.push(
      () =>
        new Promise<void>((r) => {
          server.closeAllConnections()
          server.close(() => r())
        })
    )
    return { s, h }
  }

  // The port is checked free at the start only; the engine binds it after loading (minutes for a real model).
  it("a server outside the engine's group answering on the engine's port does not make the engine Ready", async () => {
    const { s, h } = await foreignListener({})
    const seen = await awaitState(
      h,
      "Ready, or the foreign listener seen",
      (x) => x._tag === "Ready" || (x._tag === "Starting" && x.phase === "port held by another process")
    )
    assert.strictEqual(seen._tag, "Starting", "Ready on another process's answer")
    assert.isTrue(
      h.logs.some((l) => l.includes(`port ${s.port} is answered by a process outside the engine's process group`)),
      h.logs.join("\n")
    )
  })

  it("with engine.verify_listener = false (an engine run outside the group, e.g. in a container) any answer counts", async () => {
    const { h } = await foreignListener({ verify_listener: false })
    const seen = await awaitState(
      h,
      "Ready, or the foreign listener seen",
      (x) => x._tag === "Ready" || (x._tag === "Starting" && x.phase === "port held by another process")
    )
    assert.strictEqual(seen._tag, "Ready")
  })
})

describe("llama.cpp readiness", () => {
  it("not Ready while a newer llama-server answers /v1/models 200 during load: Ready only after /health", async () => {
    const s = await setup("llama_cpp", { knobs: ["--sim-startup-delay", "3s", "--sim-models-while-loading"] })
    const h = await start(s.plan, s.settings)
    const base = `http://127.0.0.1:${s.port}`
    await waitFor("/v1/models 200 while loading", async () => (await fetch(`${base}/v1/models`)).status === 200)
    assert.strictEqual((await fetch(`${base}/health`)).status, 503, "the engine is still loading")
    // The moment the agent says Ready, llama-server's own /health must already say so (loading lasts 3 s,
    // probes run every 100 ms: a /v1/models probe turns Ready while /health is still 503).
    await awaitState(h, "Ready", (x) => x._tag === "Ready")
    assert.strictEqual((await fetch(`${base}/health`)).status, 200, "Ready ahead of llama-server's /health")
  })
})

describe("the configured layer", () => {
  it("EngineProcess.layer supervises the plan rendered from Config (planLayer)", async () => {
    const port = await freePort()
    const stateDir = tmpDir()
    const scope = Effect.runSync(Scope.make())
    cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
    const live = EngineProcessLive.layer.pipe(
      Layer.provide(liveHost),
      Layer.provideMerge(planLayer),
      Layer.provide(
        layerFromObject({
          agent: { state_dir: stateDir },
          engine: { kind: "vllm", url: `http://127.0.0.1:${port}`, command: [process.execPath, simEntry] },
          models: { m: { hf_repo: "org/m" } }
        })
      ),
      Layer.provide(quietLogger([]))
    )
    const ctx = await Effect.runPromise(Layer.buildWithScope(live, scope))
    const engine = Context.get(ctx, EngineProcess)
    await Effect.runPromise(engine.awaitReady.pipe(Effect.timeout(20_000)))
    assert.strictEqual(engine.plan.port, port)
    assert.strictEqual((await pidRecord(stateDir))?.pgid, (await simState(port)).pid)
  })
})

describe("restarts", () => {
  it("crash -> Restarting with a growing delay, exit code and last lines kept", async () => {
    const s = await setup("vllm", { knobs: ["--sim-crash-after", "200ms"] })
    const h = await start(s.plan, s.settings)
    const restarting = () => h.states.filter((x) => x._tag === "Restarting")
    await waitFor("three restarts", () => restarting().length >= 3)
    const delays = restarting().map((x) => (x._tag === "Restarting" ? x.nextAt - x.lastExit.endedAt : -1))
    const attempts = restarting().map((x) => (x._tag === "Restarting" ? x.attempt : -1))
    assert.deepStrictEqual(attempts.slice(0, 3), [1, 2, 3])
    // The backoff itself, as the supervisor logs it: nextAt is the Clock's now after the run's scope closed plus the
    // delay, so nextAt - endedAt is at least the delay and more by what closing took (a loaded machine: 65 ms).
    for (const [i, expected] of [100, 200, 400].entries()) {
      assert.isAtLeast(delays[i]!, expected)
      assert.isTrue(
        h.logs.some((l) => l.includes(`restart attempt ${i + 1} in ${expected} ms`)),
        `attempt ${i + 1} in ${expected} ms`
      )
    }
    const first = restarting()[0]
    if (first?._tag === "Restarting") {
      assert.strictEqual(first.lastExit.code, 1)
      assert.strictEqual(first.lastExit.reason, "exited")
      assert.isTrue(first.lastExit.lastLines.some((l) => l.includes("[stderr]")))
      assert.isAtMost(first.lastExit.lastLines.length, 50)
    }
    assert.isAtLeast(await Effect.runPromise(h.engine.restarts), 2)
    assert.isTrue(
      h.logs.some((l) => l.includes("exit code 1") && l.includes("crash loop")),
      "crash loop logged"
    )
  })

  it("vLLM's engine core dead under a live API server (/health 503, /v1/models 200): restarted on the default liveness probe", async () => {
    // VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps vLLM's API server up after its engine died (vllm/entrypoints/launcher.py);
    // without it the server exits 0 within its 5 s watchdog (the next test)
    const s = await setup("vllm", { engine: { env: { VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "1" } } })
    const port = s.port
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const before = await simState(port)
    await postFaults(port, { engineDead: true })
    assert.strictEqual((await fetch(`http://127.0.0.1:${port}/v1/models`)).status, 200)
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting") assert.match(r.lastExit.reason, /^unhealthy: 3 liveness probes failed/)
    await awaitState(h, "Ready of run 1", (x) => x._tag === "Ready" && x.run === 1)
    assert.notStrictEqual((await simState(port)).pid, before.pid)
  })

  it("vLLM's engine core dead, by default: its API server exits 0 within its watchdog, and is restarted", async () => {
    // liveness failing only after 20 s: the exit (within the watchdog's 5 s) is what the supervisor sees
    const s = await setup("vllm", { engine: { liveness_failures: 100 } })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const before = await simState(s.port)
    await postFaults(s.port, { engineDead: true })
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting") assert.deepStrictEqual([r.lastExit.reason, r.lastExit.code], ["exited", 0])
    await awaitState(h, "Ready of run 1", (x) => x._tag === "Ready" && x.run === 1)
    assert.notStrictEqual((await simState(s.port)).pid, before.pid)
  })

  it("SGLang's /health generates (a second each): Ready through probes at a 200 ms interval, restarted once its scheduler wedges", async () => {
    // SGLang's own timeout for a health check's generation, short here: a wedged scheduler's answer is then a 503.
    const s = await setup("sglang", { engine: { env: { SGLANG_HEALTH_CHECK_TIMEOUT: "1" } } })
    assert.strictEqual(s.plan.livenessTimeoutFloorMs, 3_000)
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const before = await simState(s.port)
    // Three liveness checks answered, each after its second: with probes given 200 ms they would all have failed.
    await pollUntil("3 health checks answered", async () =>
      (await simState(s.port)).healthChecks >= 3 ? true : undefined
    )
    assert.isFalse(
      h.logs.some((l) => l.includes("liveness probe failed")),
      "no liveness probe failed on a healthy SGLang"
    )
    assert.strictEqual(current(h)?._tag, "Ready")
    await postFaults(s.port, { wedged: true })
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting")
      assert.match(r.lastExit.reason, /^unhealthy: 3 liveness probes failed in a row, last: .*503/)
    await awaitState(h, "Ready of run 1", (x) => x._tag === "Ready" && x.run === 1)
    assert.notStrictEqual((await simState(s.port)).pid, before.pid)
  })

  it("a stalled engine -> Unhealthy -> restarted and Ready again", async () => {
    const s = await setup("vllm", { healthProbe: true })
    const port = s.port
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const before = await simState(port)
    await postFaults(port, { hangHealth: true })
    await awaitState(h, "Unhealthy", (x) => x._tag === "Unhealthy")
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting") assert.match(r.lastExit.reason, /^unhealthy: 3 liveness probes failed/)
    await awaitState(h, "Ready of run 1", (x) => x._tag === "Ready" && x.run === 1)
    const after = await simState(port)
    assert.notStrictEqual(after.pid, before.pid)
    assert.isFalse(groupAlive(before.pid), "the stalled engine's group is gone")
  })

  it("the spawn is logged with its argv and env, secrets redacted", async () => {
    const s = await setup("vllm", {
      knobs: ["--hf-token", "hf-very-secret"],
      engine: { api_key: "sk-very-secret", env: { HF_TOKEN: "hf_very_secret", HF_HOME: "/cache" } }
    })
    const h = await start(s.plan, s.settings)
    const line = await waitFor("spawn log", () => h.logs.find((l) => l.includes("engine run 0: spawning")))
    assert.include(line, '"--hf-token","<redacted>"')
    assert.include(line, '"VLLM_API_KEY":"<redacted>"')
    assert.include(line, '"HF_TOKEN":"<redacted>"')
    assert.include(line, '"HF_HOME":"/cache"')
    assert.notInclude(line, "very_secret")
    assert.notInclude(line, "very-secret")
  })

  it("the engine gets the agent's environment and [engine].env, not the agent's MALLOC_ARENA_MAX", async () => {
    // The engine here is a script that writes its environment to a file and waits to be stopped. Written whole, then
    // renamed: a poll that read the file mid-write (seen once in a full run on a loaded host) parsed half a JSON.
    const dump = `const fs = require("node:fs"), out = process.env.CGN_TEST_ENV_OUT; fs.writeFileSync(out + ".tmp", JSON.stringify(process.env)); fs.renameSync(out + ".tmp", out); setInterval(() => {}, 1000)`
    const saved = process.env.MALLOC_ARENA_MAX
    process.env.MALLOC_ARENA_MAX = "1"
    cleanups.push(() => {
      if (saved === undefined) delete process.env.MALLOC_ARENA_MAX
      else process.env.MALLOC_ARENA_MAX = saved
    })
    const seen = async (engineEnv: Record<string, string>) => {
      const out = path.join(tmpDir(), "env.json")
      const s = await setup("vllm", {
        engine: { command: [process.execPath, "-e", dump], env: { CGN_TEST_ENV_OUT: out, ...engineEnv } }
      })
      const h = await start(s.plan, s.settings)
      const text = await waitFor("the engine's environment", () => fs.existsSync(out) && fs.readFileSync(out, "utf8"))
      await h.close()
      return JSON.parse(text) as Record<string, string>
    }
    const plain = await seen({ HF_HOME: "/cache" })
    assert.strictEqual(plain.HF_HOME, "/cache")
    assert.strictEqual(plain.PATH, process.env.PATH)
    assert.notProperty(plain, "MALLOC_ARENA_MAX")
    const chosen = await seen({ MALLOC_ARENA_MAX: "4" })
    assert.strictEqual(chosen.MALLOC_ARENA_MAX, "4")
  })

  it("an engine that cannot be spawned -> Restarting with the spawn error, failing from attempt 3, still retried", async () => {
    const s = await setup("vllm", {
      engine: { command: ["/nonexistent/engine-binary"], restart_backoff_max: "300ms" }
    })
    const h = await start(s.plan, s.settings)
    const restarting = () => h.states.filter((x) => x._tag === "Restarting")
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting") assert.match(r.lastExit.reason, /^spawn failed: .*ENOENT/)
    // Past the cap: the retries go on, every delay capped at restart_backoff_max.
    await waitFor("six attempts", () => restarting().length >= 6, 30_000)
    const seen = restarting().flatMap((x) => (x._tag === "Restarting" ? [x] : []))
    assert.deepStrictEqual(
      seen.map((x) => x.failing !== undefined),
      [false, false, true, true, true, true, ...seen.slice(6).map(() => true)]
    )
    assert.match(seen[2]?.failing ?? "", /^engine failing: 3 runs in a row .*ENOENT/)
    // each delay as the supervisor chose it (nextAt counts from when it chose, after the exit: load would stretch it)
    const delays = h.logs.flatMap((l) => /restart attempt (\d+) in (\d+) ms/.exec(l)?.slice(1).map(Number) ?? [])
    assert.isAtLeast(delays.length, 12)
    assert.deepStrictEqual(delays.slice(0, 6), [1, 100, 2, 200, 3, 300])
    for (let i = 6; i < delays.length; i += 2) assert.strictEqual(delays[i + 1], 300, `attempt ${delays[i]}`)
    // Between attempts the next run's Starting keeps the mark: the node never looks merely "starting" again.
    assert.isTrue(h.states.some((x) => x._tag === "Starting" && x.run >= 3 && x.failing !== undefined))
    assert.isTrue(
      h.logs.some((l) => /^error/i.test(l) && l.includes("ENOENT")),
      "logged as an error"
    )
  })
})

describe("stop", () => {
  it("an engine ignoring SIGTERM is killed after stop_grace", async () => {
    const s = await setup("vllm", { knobs: ["--sim-ignore-sigterm"] })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const { pid } = await simState(s.port)
    const t0 = Date.now()
    await Effect.runPromise(h.engine.stop)
    assert.isAtLeast(Date.now() - t0, 450)
    const last = current(h)
    if (last?._tag === "Stopped") assert.strictEqual(last.lastExit?.signal, "SIGKILL", h.logs.join("\n"))
    else assert.fail(`expected Stopped, got ${last?._tag}`)
    assert.isFalse(groupAlive(pid))
  })

  // A stopped engine (SIGSTOP: a liveness restart of a frozen engine, a debugger) keeps SIGTERM pending until it
  // runs again; without the SIGCONT that follows the TERM it sat out stop_grace and was killed (a llama-server soak).
  it("a stopped engine is continued after its SIGTERM and exits on it, not killed after stop_grace", async () => {
    const s = await setup("vllm", { engine: { stop_grace: "20s" } })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const { pid } = await simState(s.port)
    process.kill(pid, "SIGSTOP")
    await Effect.runPromise(h.engine.stop.pipe(Effect.timeout(15_000)))
    const last = current(h)
    if (last?._tag !== "Stopped") return assert.fail(`expected Stopped, got ${last?._tag}`)
    assert.notStrictEqual(last.lastExit?.signal, "SIGKILL", h.logs.join("\n"))
    assert.isFalse(groupAlive(pid))
  })

  // Engines take a second SIGTERM as "exit now" (the simulator too: exit 1 and "Received second interrupt"),
  // so a stop must send exactly one: the engine then finishes its graceful shutdown and exits 0.
  it("stop sends exactly one SIGTERM: the engine's graceful shutdown runs to its end (exit 0)", async () => {
    const s = await setup("llama_cpp", {
      knobs: ["--sim-shutdown-delay", "1500ms"],
      engine: { stop_grace: "10s" }
    })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const { pid } = await simState(s.port)
    const t0 = Date.now()
    await Effect.runPromise(h.engine.stop)
    const last = current(h)
    if (last?._tag !== "Stopped") return assert.fail(`expected Stopped, got ${last?._tag}`)
    const lines = last.lastExit?.lastLines.join("\n") ?? ""
    assert.notInclude(lines, "Received second interrupt", "a second signal reached the engine")
    assert.include(lines, '"msg":"shut down"', "the graceful shutdown finished")
    assert.strictEqual(last.lastExit?.code, 0, lines)
    assert.isNull(last.lastExit?.signal ?? null)
    assert.isAtLeast(Date.now() - t0, 1_400, "the stop waited for the engine's own shutdown")
    assert.isFalse(groupAlive(pid))
    // the engine's own JSON line, relayed as the log message with its fields (layers/observability/Logging.ts engineOutput)
    const began = h.logs.filter((l) => l.startsWith("Info shutting down "))
    assert.strictEqual(began.length, 1, began.join("\n"))
  })

  it("a stop during startup ends the run at once and settles in Stopped", async () => {
    // The engine would take two minutes to load: a stop that waited for the startup to end would take as long.
    const s = await setup("llama_cpp", { knobs: ["--sim-startup-delay", "120s"] })
    const h = await start(s.plan, s.settings)
    await awaitState(h, "the engine spawned", (x) => x._tag === "Starting" && x.phase !== "spawning")
    const pid = (await pidRecord(s.stateDir))?.pgid
    assert.isNumber(pid)
    assert.isTrue(groupAlive(pid!))
    const t0 = Date.now()
    await Effect.runPromise(h.engine.stop)
    // The simulator exits on its first SIGTERM; the bound leaves a slow machine seconds to spare.
    assert.isBelow(Date.now() - t0, 8_000, "the stop waited")
    assert.deepStrictEqual(
      h.states.slice(-2).map((x) => x._tag),
      ["Stopping", "Stopped"]
    )
    assert.isFalse(groupAlive(pid!))
  })

  it("stop kills the forked grandchild too", async () => {
    const s = await setup("vllm", { knobs: ["--sim-fork-grandchild"] })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    const { pid, grandchildPid } = await simState(s.port)
    assert.isNumber(grandchildPid)
    assert.isTrue(pidAlive(grandchildPid!))
    await h.close()
    assert.isFalse(pidAlive(grandchildPid!), "grandchild gone")
    assert.isFalse(groupAlive(pid), "group gone")
  })
})

describe("no orphans", () => {
  /** Runs the stand-in agent (test/fixtures/supervise.ts) to Ready, SIGKILLs it, and waits for the guard's cleanup. */
  const killAgentTrial = async (knobs: ReadonlyArray<string>) => {
    const s = await setup("vllm", { knobs })
    const { agent, out } = spawnAgent(s)
    const { pid, grandchildPid, guardPid } = await (async () => {
      await waitFor("the supervised engine Ready", () => out().includes('"_tag":"Ready"'), 20_000)
      const state = await simState(s.port)
      return { ...state, guardPid: (await pidRecord(s.stateDir))?.guardPid }
    })()
    // Whatever a failing trial leaves behind is killed here, not left to the next test.
    cleanups.push(() => {
      for (const p of [grandchildPid, pid, guardPid]) {
        try {
          if (p !== undefined && p !== null) process.kill(p, "SIGKILL")
        } catch {
          // gone, as it should be
        }
      }
    })
    assert.isNumber(guardPid)
    assert.isNumber(grandchildPid)
    assert.isTrue(pidAlive(grandchildPid!))
    agent.kill("SIGKILL")
    // The guard's own bounds: grace (500 ms) + the KILL confirmation; generous for a loaded machine.
    await waitFor(
      "engine, grandchild and guard gone",
      () => !groupAlive(pid) && !pidAlive(grandchildPid!) && !pidAlive(guardPid!),
      8_000
    )
  }

  // Regression for the classic supervisor bug: the supervisor dies hard and its engine keeps the GPU and port.
  it("the agent SIGKILLed leaves no engine, grandchild or guard behind", () =>
    killAgentTrial(["--sim-fork-grandchild"]))

  // Nobody reads the guard's stderr once the agent is dead: its writes fail with EPIPE, and before the fix that
  // killed the guard between its TERM and its KILL, so a TERM-ignoring grandchild survived every time.
  it("the agent SIGKILLed while the engine and its grandchild ignore SIGTERM: all gone (3 trials)", async () => {
    for (let trial = 0; trial < 3; trial++) await killAgentTrial(["--sim-ignore-sigterm", "--sim-fork-grandchild"])
  }, 90_000)

  it("a stale engine recorded by a previous agent is stopped, then the new one starts", async () => {
    const s = await setup("vllm")
    const stale: SimHandle = await startSim({ flavor: "vllm", args: ["--port", String(s.port)] })
    cleanups.push(() => stale.stop(100))
    const dead = spawn("true")
    await new Promise((r) => dead.once("exit", r))
    await writeRecord(s.stateDir, {
      agentPid: dead.pid!,
      guardPid: undefined,
      pgid: stale.pid,
      host: "127.0.0.1",
      port: s.port,
      startedAt: Date.now(),
      exe: processExe(stale.pid)
    })
    const h = await start(s.plan, s.settings)
    await stale.exited
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    assert.notStrictEqual((await simState(s.port)).pid, stale.pid)
    assert.isTrue(h.logs.some((l) => l.includes(`left by agent pid ${dead.pid}`)))
  })

  it("a record whose group started at another time (a reused pid) is ignored: that group lives, the engine starts", async () => {
    const s = await setup("vllm")
    // Someone else's process in its own group, under the pid an old record names (as after a reboot).
    const bystander = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
    cleanups.push(() => {
      bystander.kill("SIGKILL")
    })
    const dead = spawn("true")
    await new Promise((r) => dead.once("exit", r))
    await writeRecord(s.stateDir, {
      agentPid: dead.pid!,
      guardPid: undefined,
      pgid: bystander.pid!,
      host: "127.0.0.1",
      port: s.port,
      startedAt: Date.now() - 3_600_000
    })
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    assert.isTrue(groupAlive(bystander.pid!), "the unrelated group was not signalled")
    assert.isTrue(
      h.logs.some((l) => l.includes("a reused pid; ignoring the record")),
      h.logs.join("\n")
    )
  })

  // The security review's attack (FINDINGS.md, item 3a): a hand-written record naming an unrelated `setsid sleep`
  // with its real start time (/proc/<pid>/stat is world-readable) got that group killed at start.
  it("a record naming a live group that runs no recorded engine executable leaves that group alone", async () => {
    const s = await setup("vllm")
    const bystander = spawn("sleep", ["600"], { detached: true, stdio: "ignore" })
    cleanups.push(() => {
      bystander.kill("SIGKILL")
    })
    const dead = spawn("true")
    await new Promise((r) => dead.once("exit", r))
    const pid = bystander.pid!
    await pollUntil("the sleep exec'd", () => processExe(pid)?.endsWith("sleep"), 5_000, 10)
    const forged = { agentPid: dead.pid!, guardPid: undefined, pgid: pid, host: "127.0.0.1", port: s.port }
    // as the review wrote it (no executable), then naming an executable the group does not run
    for (const exe of [undefined, process.execPath]) {
      fs.writeFileSync(pidFilePath(s.stateDir), JSON.stringify({ ...forged, startedAt: processStartMs(pid), exe }))
      const h = await start(s.plan, s.settings)
      await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
      assert.isTrue(groupAlive(pid), "the unrelated group was not signalled")
      assert.isTrue(
        h.logs.some((l) => l.includes(`names process group ${pid}, but`) && l.includes("the group is left alone")),
        h.logs.join("\n")
      )
      assert.isFalse(h.logs.some((l) => l.includes(`stopping engine group ${pid}`)))
      await h.close()
    }
  })

  it("a live agent still owning its engine refuses the start", async () => {
    const s = await setup("vllm")
    const other: SimHandle = await startSim({ flavor: "vllm", args: ["--port", String(s.port)] })
    cleanups.push(() => other.stop(100))
    await writeRecord(s.stateDir, {
      agentPid: other.pid,
      guardPid: undefined,
      pgid: other.pid,
      host: "127.0.0.1",
      port: s.port,
      startedAt: Date.now()
    })
    const { exit } = await build(s.plan, s.settings)
    assert.isTrue(Exit.isFailure(exit))
    assert.match(JSON.stringify(Exit.isFailure(exit) ? exit.cause : ""), /"reason":"AnotherAgent"/)
    assert.isTrue(groupAlive(other.pid), "the other agent's engine is left alone")
  })

  it("a foreign listener on the engine port refuses the start with PortBusy", async () => {
    const s = await setup("vllm")
    const server = net.createServer()
    await new Promise<void>((r) => server.listen(s.port, "127.0.0.1", r))
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())))
    const { exit } = await build(s.plan, s.settings)
    assert.isTrue(Exit.isFailure(exit))
    assert.match(JSON.stringify(Exit.isFailure(exit) ? exit.cause : ""), /"reason":"PortBusy"/)
  })
})

describe("openai_compat", () => {
  it("no process; Ready, Unhealthy on a stall, Restarting, Ready again when it recovers", async () => {
    const sim = await startSim({ flavor: "vllm" })
    cleanups.push(() => sim.stop(100))
    const s = await setup("openai_compat", { healthProbe: true, port: sim.port })
    assert.isFalse(s.plan.spawns)
    const h = await start(s.plan, s.settings)
    await Effect.runPromise(h.engine.awaitReady.pipe(Effect.timeout(20_000)))
    await postFaults(sim.port, { hangHealth: true })
    const r = await awaitState(h, "Restarting", (x) => x._tag === "Restarting")
    if (r._tag === "Restarting") assert.strictEqual(r.lastExit.pid, undefined)
    await postFaults(sim.port, { hangHealth: false })
    await awaitState(h, "Ready of run 1", (x) => x._tag === "Ready" && x.run === 1)
    await h.close()
    assert.strictEqual(current(h)?._tag, "Stopped")
  })

  it("in front of a newer llama-server, not Ready while /v1/models lists the model loading (meta: null)", async () => {
    const sim = await startSim({
      flavor: "llama_cpp",
      args: ["-hf", "org/m", "--sim-startup-delay", "3s", "--sim-models-while-loading"]
    })
    cleanups.push(() => sim.stop(100))
    const base = `http://127.0.0.1:${sim.port}`
    await waitFor("/v1/models 200 while loading", async () => (await fetch(`${base}/v1/models`)).status === 200)
    const s = await setup("openai_compat", { port: sim.port })
    const h = await start(s.plan, s.settings)
    // Loading lasts 3 s and probes run every 100 ms: a bare 200 would make it Ready while /health is still 503
    await awaitState(h, "Ready", (x) => x._tag === "Ready")
    assert.strictEqual((await fetch(`${base}/health`)).status, 200, "Ready ahead of llama-server's /health")
  })
})

describe("layerTest", () => {
  it("publishes hand-set states and records exits; stop settles in Stopped with the last exit", async () => {
    const program = Effect.gen(function* () {
      const engine = yield* EngineProcess
      const control = yield* EngineProcessLayer.EngineProcessControl
      const ready = yield* Effect.forkChild(engine.awaitReady)
      yield* control.set(State.Ready({ since: 1, run: 0 }))
      yield* Fiber.join(ready)
      const exit = EngineProcessLayer.testExit(0)
      yield* control.recordExit(exit)
      yield* engine.stop
      return { state: yield* engine.state, restarts: yield* engine.restarts }
    })
    const out = await Effect.runPromise(program.pipe(Effect.provide(EngineProcessLayer.layerTest())))
    assert.strictEqual(out.restarts, 1)
    assert.strictEqual(out.state._tag, "Stopped")
    if (out.state._tag === "Stopped") assert.strictEqual(out.state.lastExit?.code, 1)
  })
})
