// A connection to the engine that the agent's own host could not open (EMFILE and the like: services/node/
// HostShortage.ts) is the agent's failure, not the engine's. A fault review ran the agent under a low descriptor limit:
// calls failed "engine unreachable: EMFILE", counted against the engine until the node read unhealthy ("engine failing
// calls") with a restart of its sound engine due; a liveness probe failing so would have restarted it outright. Here:
// the classification (pure), the call's status, the real probe and the real engine spawn in a process out of
// descriptors (the spawn threw inside the supervisor's loop and left the engine "spawning" for good, silently), and
// the production supervisor on a TestClock whose probes cannot be sent.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { assert, it as effectIt } from "@effect/vitest"
import { Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { transportError } from "../../src/layers/engine/exchange.ts"
import { EngineError } from "../../src/services/engine/EngineClient.ts"
import { connectionBroke } from "../../src/services/grpc/EngineCut.ts"
import { engineDecisions } from "../../src/services/grpc/EngineStatus.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { asSent } from "../../src/services/grpc/StatusMessage.ts"
import { hostShortage } from "../../src/services/node/HostShortage.ts"
import { testPlan } from "../../src/testing/EngineProcess.ts"
import { makeFakeHost } from "../support/fakeEngineHost.ts"
import { settle } from "../support/poll.ts"
import { freePort } from "../support/ports.ts"
import { superviseFake, superviseFakeHost, testSettings } from "../support/supervisor.ts"

/** undici's connect failure as it reaches the engine client: the socket's code on the error. */
const socketError = (code: string) =>
  Object.assign(new Error(`connect ${code} 127.0.0.1:8000 - Local (undefined:undefined)`), { code })

/**
 * Runs `setup`, then fills the process's descriptor table, runs `then` and prints `result` (a JS expression) as
 * JSON: in a child, its own table, small (util-linux's prlimit, on every Debian host; Node raises its soft limit to
 * the hard one). Its imports by absolute path: the script lives outside the repository.
 */
const outOfDescriptors = (setup: string, then: string, result: string) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-shortage-"))
  try {
    const script = path.join(dir, "out-of-fds.ts")
    fs.writeFileSync(
      script,
      `import * as fs from "node:fs"
import * as net from "node:net"
import { Effect } from ${JSON.stringify(import.meta.resolve("effect"))}
${setup}
const held = []
try { for (;;) held.push(fs.openSync("/dev/null", "r")) } catch (e) { if (e.code !== "EMFILE") throw e }
${then}
for (const fd of held) fs.closeSync(fd)
process.stdout.write(JSON.stringify(${result}))
process.exit(0)
`
    )
    const prlimit = ["/usr/bin/prlimit", "/bin/prlimit"].find((p) => fs.existsSync(p))
    const [cmd, args] =
      prlimit === undefined ? [process.execPath, [script]] : [prlimit, ["--nofile=512:512", process.execPath, script]]
    const r = spawnSync(cmd, args, { cwd: process.cwd(), encoding: "utf8", timeout: 20_000 })
    expect(r.status, r.stderr).toBe(0)
    return JSON.parse(r.stdout)
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

describe("a connection the agent's host could not open", () => {
  it("is Local for each shortage, before the request was written; a refused connection stays the engine's", () => {
    for (const code of ["EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "EADDRNOTAVAIL"]) {
      const e = transportError(socketError(code), false)
      expect([code, e.reason, e.message.startsWith(`${hostShortage(code)}: ${code}: connect ${code}`)]).toEqual([
        code,
        "Local",
        true
      ])
    }
    expect(hostShortage("EMFILE")).toMatch(/^too many open files: the agent.s descriptor limit \(ulimit -n\)/)
    expect(transportError(socketError("ECONNREFUSED"), false).reason).toBe("Connect")
    // once the engine had the request, a broken connection is the engine's answer breaking off, whatever the code
    expect(transportError(socketError("ENOBUFS"), true).reason).toBe("Stream")
  })

  it("ends the call UNAVAILABLE as the agent's, retryable on another node, never counted against the engine", () => {
    const e = transportError(socketError("EMFILE"), false)
    const f = toGrpcFailure(e)
    expect(f.trailers["cgn-error-source"]).toBe("agent")
    expect(f.trailers["cgn-reason"]).toBe("agent_resources")
    expect(f.message).toMatch(
      /^the agent could not connect to the engine: too many open files: the agent.s descriptor limit/
    )
    expect(asSent(f, false)).toMatchObject({ retryable: true })
    expect(engineDecisions(e)).toMatchObject({ failsCall: false, retryElsewhere: true })
    // a refused connection is counted, and is a broken engine's sign (EngineCut waits for its exit); a shortage neither
    const refused = new EngineError({ reason: "Connect", message: "ECONNREFUSED" })
    expect([engineDecisions(refused).failsCall, connectionBroke(refused), connectionBroke(e)]).toEqual([
      true,
      true,
      false
    ])
  })

  it("a probe in a process out of descriptors is inconclusive, not a failed one", () => {
    const { ok, out } = outOfDescriptors(
      `import { probeOnce } from ${JSON.stringify(path.resolve("src/layers/engine/probe.ts"))}
const server = net.createServer((s) => s.end("HTTP/1.1 200 OK\\r\\ncontent-length: 0\\r\\n\\r\\n"))
await new Promise((r) => server.listen(0, "127.0.0.1", r))
const url = "http://127.0.0.1:" + server.address().port + "/health"
const ok = await Effect.runPromise(probeOnce({ kind: "http", url }, 2000))`,
      `const out = await Effect.runPromise(probeOnce({ kind: "http", url: url + "?fresh" }, 2000))`,
      "{ ok, out }"
    )
    expect(ok).toEqual({ ok: true })
    expect(out).toMatchObject({ ok: false, inconclusive: true, phase: "the agent's host is out of resources" })
    expect(out.reason).toMatch(/^EMFILE: too many open files: the agent.s descriptor limit/)
  })

  it("an engine run whose guard cannot be spawned for want of descriptors ends with why, its scope closing cleanly", () => {
    // Node gives such a child no stdio at all: read as started, it threw on its pipes and ended the supervisor's
    // loop (the engine "spawning" for good, nothing logged)
    const { exit, closed } = outOfDescriptors(
      `import { spawnRun } from ${JSON.stringify(path.resolve("src/layers/engine/run.ts"))}
import { guardEntry } from ${JSON.stringify(path.resolve("src/programs/programPaths.ts"))}
import { Deferred, Exit, Scope } from ${JSON.stringify(import.meta.resolve("effect"))}
const scope = await Effect.runPromise(Scope.make())`,
      `const run = await Effect.runPromise(
  Scope.provide(scope)(spawnRun(guardEntry())({ argv: ["/bin/true"], env: {} }, { run: 0, graceMs: 200, linesKept: 10 }))
)
const exit = await Effect.runPromise(Deferred.await(run.exited))
const closed = Exit.isSuccess(await Effect.runPromiseExit(Scope.close(scope, Exit.void)))`,
      "{ exit, closed }"
    )
    expect(exit.code).toBe(null)
    expect(exit.problem).toMatch(/^guard: spawn .* EMFILE: the agent.s descriptor limit \(ulimit -n\) is too low/)
    expect(closed).toBe(true)
  })

  effectIt.effect("liveness probes that cannot be sent neither fail nor pass: the Ready run is left alone", () =>
    Effect.gen(function* () {
      const { fake, settings, states, lines } = yield* superviseFakeHost()
      yield* Ref.set(fake.up, true)
      yield* settle(
        "run 0 Ready",
        Effect.gen(function* () {
          yield* TestClock.adjust(500)
          return states.at(-1)?._tag === "Ready"
        })
      )
      const shortage = {
        ok: false as const,
        reason: `EMFILE: ${hostShortage("EMFILE")}`,
        phase: "the agent's host is out of resources",
        inconclusive: true as const
      }
      yield* Ref.set(fake.answer, shortage)
      // three times the probes that end a run (liveness_failures = 3), one interval at a time
      const unsent = (): number => lines.filter((l) => l.text.startsWith("liveness probe not sent")).length
      for (let i = 0; i < settings.livenessFailures * 3; i++) yield* TestClock.adjust(settings.livenessIntervalMs)
      yield* settle(
        "the unsent probe warned of",
        Effect.sync(() => unsent() === 1)
      )
      // a real failure after them is the first of the count, not the fourth
      yield* Ref.set(fake.answer, { ok: false, reason: "HTTP 503", phase: "loading" })
      yield* TestClock.adjust(settings.livenessIntervalMs)
      yield* settle(
        "the failed probe counted",
        Effect.sync(() => lines.some((l) => l.text.startsWith("liveness probe failed")))
      )
      yield* Ref.set(fake.answer, undefined)
      yield* TestClock.adjust(settings.livenessIntervalMs)
      yield* settle(
        "recovered",
        Effect.sync(() => lines.some((l) => l.text === "liveness probe recovered"))
      )
      assert.deepStrictEqual(
        lines.filter((l) => l.text.startsWith("liveness probe")).map((l) => [l.level, l.text]),
        [
          ["Warn", `liveness probe not sent: ${shortage.reason}; not counted against the engine`],
          ["Info", "liveness probes sent again"],
          ["Warn", "liveness probe failed (1/3): HTTP 503"],
          ["Info", "liveness probe recovered"]
        ]
      )
      assert.strictEqual(states.at(-1)?._tag, "Ready")
      assert.strictEqual((yield* Ref.get(fake.runs)).length, 1, "the run was never ended")
    })
  )

  effectIt.effect("a defect in the supervisor's loop is logged as one, not left as a silent 'spawning'", () =>
    Effect.gen(function* () {
      const port = yield* Effect.promise(freePort)
      const plan = testPlan({ port, probe: { kind: "http", url: `http://127.0.0.1:${port}/health` } })
      const fake = yield* makeFakeHost()
      const { lines, states } = yield* superviseFake(plan, testSettings(), {
        ...fake.host,
        spawn: () => Effect.die(new TypeError("child.stdio is not iterable"))
      })
      const said = "the engine supervisor stopped on a defect of the agent's"
      yield* settle(
        "the defect logged",
        Effect.sync(() => lines.some((l) => l.text.startsWith(said)))
      )
      const line = lines.find((l) => l.text.startsWith(said))!
      assert.strictEqual(line.level, "Error")
      assert.strictEqual(
        line.text,
        `${said}: the engine is no longer supervised (restarts, liveness, stop); not restarted (restart the agent)`
      )
      // and not left "spawning": Stopped, which nothing takes as servable
      yield* settle(
        "Stopped",
        Effect.sync(() => states.at(-1)?._tag === "Stopped")
      )
    })
  )
})
