// The supervisor's pure lifecycle: every state x event pair of the transition table, the restart backoff
// (exponential, capped, reset after a stable run, crash loop), the liveness counter and the exit summary.
import { assert, describe, it } from "@effect/vitest"
import { Result } from "effect"
import type { EngineState, ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import {
  type BackoffPolicy,
  backoffDelay,
  describeExit,
  describeStatus,
  Event,
  failingOf,
  failingReason,
  livenessStep,
  nextRestart,
  noRestartYet,
  State,
  type SupervisorEvent,
  transition
} from "../../src/services/engine/EngineState.ts"

const exitOf = (run: number): ExitRecord => ({
  run,
  pid: 4242,
  code: 1,
  signal: null,
  startedAt: 0,
  endedAt: 1500,
  runtimeMs: 1500,
  reason: "exited",
  endedBy: { kind: "exited" },
  lastLines: ["[stderr] boom"],
  oomKills: undefined,
  memoryLimitBytes: undefined
})

const states = {
  Starting: State.Starting({ phase: "loading", since: 100, run: 2 }),
  Ready: State.Ready({ since: 200, run: 2 }),
  Unhealthy: State.Unhealthy({ reason: "x", since: 300, run: 2 }),
  Restarting: State.Restarting({ attempt: 1, nextAt: 500, lastExit: exitOf(1) }),
  Stopping: State.Stopping({ since: 400 }),
  Stopped: State.Stopped({ lastExit: undefined })
} satisfies Record<EngineState["_tag"], EngineState>

const events = {
  Spawned: Event.Spawned({ run: 2, pid: 9, at: 10 }),
  Phase: Event.Phase({ phase: "waiting for port", at: 1000 }),
  ProbeOk: Event.ProbeOk({ at: 1000 }),
  LivenessLost: Event.LivenessLost({ reason: "r", at: 1000 }),
  StartupTimedOut: Event.StartupTimedOut({ budgetMs: 50, at: 1000 }),
  Exited: Event.Exited({ exit: exitOf(2), attempt: 2, nextAt: 2000 }),
  RestartDue: Event.RestartDue({ run: 2, phase: "spawning", at: 1000 }),
  StopRequested: Event.StopRequested({ at: 1000 }),
  StopCompleted: Event.StopCompleted({ lastExit: exitOf(2) })
} satisfies Record<SupervisorEvent["_tag"], SupervisorEvent>

type Expect = EngineState | "same" | "invalid"
const restarting = State.Restarting({ attempt: 2, nextAt: 2000, lastExit: exitOf(2) })
const stopping = State.Stopping({ since: 1000 })
const I = "invalid" as const

const table: Record<keyof typeof states, Record<keyof typeof events, Expect>> = {
  Starting: {
    Spawned: State.Starting({ phase: "loading", since: 100, run: 2 }),
    Phase: State.Starting({ phase: "waiting for port", since: 100, run: 2 }),
    ProbeOk: State.Ready({ since: 1000, run: 2 }),
    LivenessLost: I,
    StartupTimedOut: State.Unhealthy({ reason: "not ready within 50 ms", since: 1000, run: 2 }),
    Exited: restarting,
    RestartDue: I,
    StopRequested: stopping,
    StopCompleted: I
  },
  Ready: {
    Spawned: I,
    Phase: I,
    ProbeOk: "same",
    LivenessLost: State.Unhealthy({ reason: "r", since: 1000, run: 2 }),
    StartupTimedOut: I,
    Exited: restarting,
    RestartDue: I,
    StopRequested: stopping,
    StopCompleted: I
  },
  Unhealthy: {
    Spawned: I,
    Phase: I,
    ProbeOk: I,
    LivenessLost: I,
    StartupTimedOut: I,
    Exited: restarting,
    RestartDue: I,
    StopRequested: stopping,
    StopCompleted: I
  },
  Restarting: {
    Spawned: I,
    Phase: I,
    ProbeOk: I,
    LivenessLost: I,
    StartupTimedOut: I,
    Exited: I,
    RestartDue: State.Starting({ phase: "spawning", since: 1000, run: 2 }),
    StopRequested: stopping,
    StopCompleted: I
  },
  Stopping: {
    Spawned: I,
    Phase: I,
    ProbeOk: I,
    LivenessLost: I,
    StartupTimedOut: I,
    Exited: I,
    RestartDue: I,
    StopRequested: "same",
    StopCompleted: State.Stopped({ lastExit: exitOf(2) })
  },
  Stopped: {
    Spawned: I,
    Phase: I,
    ProbeOk: I,
    LivenessLost: I,
    StartupTimedOut: I,
    Exited: I,
    RestartDue: I,
    StopRequested: "same",
    StopCompleted: "same"
  }
}

const check = (state: EngineState, event: SupervisorEvent, expected: Expect) => {
  const r = transition(state, event)
  if (expected === "invalid") {
    assert.isTrue(Result.isFailure(r), `${event._tag} in ${state._tag} should be invalid`)
    if (Result.isFailure(r)) {
      assert.strictEqual(r.failure.from, state._tag)
      assert.strictEqual(r.failure.event, event._tag)
    }
  } else if (expected === "same") {
    assert.isTrue(Result.isSuccess(r) && r.success === state, `${event._tag} in ${state._tag} should change nothing`)
  } else {
    assert.isTrue(Result.isSuccess(r), `${event._tag} in ${state._tag} should be valid`)
    if (Result.isSuccess(r)) assert.deepStrictEqual(r.success, expected)
  }
}

describe("transition: every state x event", () => {
  for (const [stateName, row] of Object.entries(table)) {
    for (const [eventName, expected] of Object.entries(row)) {
      it(`${stateName} + ${eventName} -> ${typeof expected === "string" ? expected : expected._tag}`, () => {
        check(states[stateName as keyof typeof states], events[eventName as keyof typeof events], expected)
      })
    }
  }
})

describe("transition: guards on the run number and no-op changes", () => {
  it.each([
    ["Spawned of another run", states.Starting, Event.Spawned({ run: 3, pid: 1, at: 0 }), I],
    ["Exited of an older run", states.Ready, Event.Exited({ exit: exitOf(1), attempt: 1, nextAt: 0 }), I],
    ["RestartDue skipping a run", states.Restarting, Event.RestartDue({ run: 3, phase: "spawning", at: 0 }), I],
    ["Phase unchanged", states.Starting, Event.Phase({ phase: "loading", at: 5 }), "same"]
  ] as const)("%s", (_name, state, event, expected) => check(state, event, expected))
})

describe("backoff", () => {
  const policy: BackoffPolicy = { initialMs: 100, maxMs: 1000, stableAfterMs: 10_000, crashLoopAfter: 3 }
  it.each([
    [1, 100],
    [2, 200],
    [3, 400],
    [4, 800],
    [5, 1000],
    [60, 1000],
    [2000, 1000]
  ])("attempt %i waits %i ms", (attempt, ms) => assert.strictEqual(backoffDelay(policy, attempt), ms))

  const prior = (attempt: number, unstableRuns: number) => ({ attempt, unstableRuns })
  it.each([
    ["first crash, never ready", prior(0, 0), undefined, 5_000, [1, 1, 100, false]],
    ["second quick crash", prior(1, 1), undefined, 5_000, [2, 2, 200, false]],
    ["third quick crash is a crash loop", prior(2, 2), undefined, 5_000, [3, 3, 400, true]],
    ["ready but not long enough", prior(4, 4), 0, 9_999, [5, 5, 1000, true]],
    ["stable run resets the backoff and the count", prior(6, 6), 0, 10_000, [1, 0, 100, false]],
    // after a stable run's end (attempt 1, no unstable run) two quick crashes are two, not a crash loop
    ["first crash after a stable run", prior(1, 0), undefined, 5_000, [2, 1, 200, false]],
    ["second crash after a stable run", prior(2, 1), undefined, 5_000, [3, 2, 400, false]],
    ["third crash after a stable run is a crash loop", prior(3, 2), undefined, 5_000, [4, 3, 800, true]]
  ] as const)("%s", (_name, previous, readyAt, endedAt, [attempt, unstableRuns, delayMs, crashLoop]) =>
    assert.deepStrictEqual(nextRestart(policy, previous, readyAt, endedAt), {
      attempt,
      unstableRuns,
      delayMs,
      crashLoop
    })
  )

  it("counts from a stable end as from the start: the crash loop after the same number of failed runs", () => {
    let plan = nextRestart(policy, noRestartYet, 0, 10_000)
    const loops: Array<boolean> = []
    for (let i = 0; i < 3; i++) {
      plan = nextRestart(policy, plan, undefined, 5_000)
      loops.push(plan.crashLoop)
    }
    assert.deepStrictEqual(loops, [false, false, true])
  })
})

// An engine that cannot be started (its command does not exist) or keeps crashing is shown as failing from the
// crash-loop threshold on, while the restarts go on; the mark lasts through the next runs' Starting and goes
// with the first Ready.
describe("failing", () => {
  const policy: BackoffPolicy = { initialMs: 100, maxMs: 1000, stableAfterMs: 10_000, crashLoopAfter: 3 }
  const enoent = { ...exitOf(2), pid: undefined, code: null, reason: "spawn failed: spawn /x/vllm ENOENT" }

  it("is set from the crash-loop threshold on, naming the last exit", () => {
    const attempts = [0, 1, 2, 3].map((n) =>
      failingReason(nextRestart(policy, { attempt: n, unstableRuns: n }, undefined, 1), enoent)
    )
    assert.deepStrictEqual(
      attempts.map((f) => f !== undefined),
      [false, false, true, true]
    )
    assert.strictEqual(
      attempts[2],
      "engine failing: 3 runs in a row ended before being stable, the last: spawn failed: spawn /x/vllm ENOENT " +
        "(no exit status); still retrying with backoff"
    )
  })

  it("goes from Exited into Restarting, through RestartDue and Spawned, and is cleared by Ready", () => {
    const failing = "engine failing: ..."
    const step = (s: EngineState, e: SupervisorEvent) => {
      const r = transition(s, e)
      if (Result.isFailure(r)) throw r.failure
      return r.success
    }
    const restarting = step(states.Starting, Event.Exited({ exit: exitOf(2), attempt: 3, nextAt: 9, failing }))
    assert.strictEqual(failingOf(restarting), failing)
    const starting = step(restarting, Event.RestartDue({ run: 3, phase: "spawning", at: 10 }))
    assert.deepStrictEqual(starting, State.Starting({ phase: "spawning", since: 10, run: 3, failing }))
    const loading = step(starting, Event.Spawned({ run: 3, pid: 5, at: 11 }))
    assert.strictEqual(failingOf(loading), failing)
    assert.strictEqual(failingOf(step(loading, Event.Phase({ phase: "waiting", at: 12 }))), failing)
    assert.strictEqual(failingOf(step(loading, Event.ProbeOk({ at: 13 }))), undefined)
    // Without the mark on Exited, nothing is failing (and no `failing` key appears).
    const plain = step(states.Starting, Event.Exited({ exit: exitOf(2), attempt: 1, nextAt: 9 }))
    assert.isFalse("failing" in plain)
  })
})

describe("liveness counter", () => {
  it.each([
    [0, true, 3, { failures: 0, lost: false }],
    [0, false, 3, { failures: 1, lost: false }],
    [1, false, 3, { failures: 2, lost: false }],
    [2, false, 3, { failures: 3, lost: true }],
    [2, true, 3, { failures: 0, lost: false }],
    [0, false, 1, { failures: 1, lost: true }]
  ] as const)("failures=%i ok=%s threshold=%i", (failures, ok, threshold, expected) =>
    assert.deepStrictEqual(livenessStep(failures, ok, threshold), expected)
  )
})

describe("describeExit", () => {
  it("names the reason, the status and the runtime", () => {
    assert.strictEqual(describeExit(exitOf(2)), "run 2 (pid 4242) ended: exited, exit code 1, after 1.5 s")
    assert.strictEqual(
      describeExit({
        ...exitOf(0),
        pid: undefined,
        code: null,
        signal: "SIGKILL",
        reason: "stopped",
        endedBy: { kind: "stopped" }
      }),
      "run 0 (pid -) ended: stopped, signal SIGKILL, after 1.5 s"
    )
  })
})

// The kernel's OOM killer, from the kills it made in the agent's memory cgroup during the run (ExitRecord.oomKills):
// said where the exit is told (the restart log line, the crash-loop reason, NodeHealth's engine detail), only when
// the count rose.
describe("OOM kills in an exit", () => {
  const gib8 = 8 * 2 ** 30
  it.each([
    [
      "SIGKILL, the count rose: killed by the OOM killer",
      { code: null, signal: "SIGKILL", endedBy: { kind: "exited" }, oomKills: 1, memoryLimitBytes: gib8 },
      "signal SIGKILL, killed by the kernel's OOM killer (1 kill in the agent's memory cgroup, limit 8.0 GiB)"
    ],
    [
      "several kills, no limit known",
      { code: null, signal: "SIGKILL", endedBy: { kind: "exited" }, oomKills: 3, memoryLimitBytes: undefined },
      "signal SIGKILL, killed by the kernel's OOM killer (3 kills in the agent's memory cgroup)"
    ],
    [
      "an exit code (a worker killed, the leader exited after it): kills during the run",
      { code: 1, signal: null, endedBy: { kind: "exited" }, oomKills: 2, memoryLimitBytes: gib8 },
      "exit code 1, 2 OOM kills in the agent's memory cgroup during this run (limit 8.0 GiB)"
    ],
    [
      "SIGKILL from the agent's own stop of an unhealthy engine: kills during the run, not the killer",
      {
        code: null,
        signal: "SIGKILL",
        endedBy: { kind: "unhealthy", reason: "probe timeout" },
        oomKills: 1,
        memoryLimitBytes: gib8
      },
      "signal SIGKILL, 1 OOM kill in the agent's memory cgroup during this run (limit 8.0 GiB)"
    ],
    [
      "SIGKILL, the count did not rise",
      { code: null, signal: "SIGKILL", endedBy: { kind: "exited" }, oomKills: 0, memoryLimitBytes: gib8 },
      "signal SIGKILL"
    ],
    [
      "SIGKILL, the count unknown (no cgroup: macOS)",
      { code: null, signal: "SIGKILL", endedBy: { kind: "exited" }, oomKills: undefined, memoryLimitBytes: undefined },
      "signal SIGKILL"
    ]
  ] as const)("%s", (_, exit, text) => assert.strictEqual(describeStatus(exit), text))

  it("reaches the exit's log line and the crash-loop reason", () => {
    const killed = { ...exitOf(4), code: null, signal: "SIGKILL", oomKills: 1, memoryLimitBytes: 2 ** 29 }
    assert.strictEqual(
      describeExit(killed),
      "run 4 (pid 4242) ended: exited, signal SIGKILL, killed by the kernel's OOM killer (1 kill in the agent's " +
        "memory cgroup, limit 512.0 MiB), after 1.5 s"
    )
    const policy: BackoffPolicy = { initialMs: 100, maxMs: 1000, stableAfterMs: 10_000, crashLoopAfter: 1 }
    assert.strictEqual(
      failingReason(nextRestart(policy, noRestartYet, undefined, 1), killed),
      "engine failing: 1 runs in a row ended before being stable, the last: exited (signal SIGKILL, killed by the " +
        "kernel's OOM killer (1 kill in the agent's memory cgroup, limit 512.0 MiB)); still retrying with backoff"
    )
  })
})

// The Exited guard (the exit is the current run's), tried with an older run only, let a guard that took any run from the
// current one on pass (a mutation audit). The supervisor numbers its runs upward (RestartDue: last + 1), so an exit of
// another run, either way, is late or foreign news and must not end the run that is going.
describe("transition, beyond the state x event table", () => {
  it("an exit of any run but the current one is invalid: a newer run's as an older one's", () => {
    for (const state of [
      State.Starting({ phase: "loading", since: 100, run: 2 }),
      State.Ready({ since: 200, run: 2 }),
      State.Unhealthy({ reason: "x", since: 300, run: 2 })
    ])
      for (const run of [1, 3]) {
        const r = transition(state, Event.Exited({ exit: exitOf(run), attempt: 1, nextAt: 0 }))
        assert.isTrue(Result.isFailure(r), `Exited of run ${run} in ${state._tag} of run 2`)
      }
  })
})
