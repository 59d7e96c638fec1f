// The exit-hint matcher (services/engine/ExitHints.ts): which well-known start failure a failed run died of, read
// newest line first from its last lines, and only for a run that ended by itself and not cleanly; then how the hint
// is told: describeExit (the restart log line, NodeHealth's detail, /readyz), failingReason (the crash-loop reason),
// /status's exit.
import { describe, expect, it } from "vitest"
import { exitForensics } from "../../src/services/admin/Admin.ts"
import type { ExitHint } from "../../src/services/engine/Engine.ts"
import type { ExitRecord, RunEnd } from "../../src/services/engine/EngineProcess.ts"
import { describeExit, failingReason } from "../../src/services/engine/EngineState.ts"
import { exitHint, type KeptLine, keepLine, matchHint } from "../../src/services/engine/ExitHints.ts"

const TABLE: ReadonlyArray<ExitHint> = [
  { patterns: ["No available memory for the cache blocks"], hint: "raise gpu_memory_utilization" },
  { patterns: ["KV cache (", "stored in KV cache"], hint: "lower max_model_len" },
  { patterns: ["CUDA out of memory"], hint: "free the GPU" }
]

const NO_KV = "[stdout] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
const KV_SMALL = "[stderr] ValueError: The model's max seq len (8192) is larger than ... KV cache (4096)."
const OOM = "[stderr] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB."
const WRAPPER = "[stderr] RuntimeError: Engine core initialization failed. See root cause above."

describe("matchHint: the first entry matching a line, newest line first", () => {
  it.each<[string, ReadonlyArray<string>, string | undefined]>([
    ["one matching line", ["[stdout] loading", NO_KV], "raise gpu_memory_utilization"],
    [
      "the cause above a wrapper line that matches nothing",
      [NO_KV, WRAPPER, "[stderr] "],
      "raise gpu_memory_utilization"
    ],
    ["the newest matching line wins over an older one", [OOM, "[stdout] retrying", KV_SMALL], "lower max_model_len"],
    ["the newest wins, in the other order too", [KV_SMALL, OOM], "free the GPU"],
    ["a second pattern of an entry", ["[stderr] ... stored in the KV cache (4096)"], "lower max_model_len"],
    [
      "within one line, the table's order",
      ["[stderr] No available memory for the cache blocks; CUDA out of memory"],
      "raise gpu_memory_utilization"
    ],
    [
      "unrelated lines: nothing",
      [
        "[stdout] INFO 09-18 [gpu_worker.py:276] Available KV cache memory: 61.23 GiB",
        "[stdout] INFO GPU KV cache size: 114,432 tokens",
        "[stderr] cuda out of memory (other case)",
        "[stdout] No available memory",
        WRAPPER
      ],
      undefined
    ],
    ["no lines: nothing", [], undefined]
  ])("%s", (_name, lines, want) => {
    expect(matchHint(TABLE, lines)).toBe(want)
  })

  it("an empty table matches nothing", () => {
    expect(matchHint([], [NO_KV])).toBeUndefined()
  })
})

describe("exitHint: only a run that ended by itself with a failure", () => {
  interface Run {
    readonly endedBy: RunEnd
    readonly code: number | null
    readonly signal: string | null
    readonly lastLines: ReadonlyArray<string>
    readonly wasReady: boolean
  }
  const run: Run = { endedBy: { kind: "exited" }, code: 1, signal: null, lastLines: [NO_KV, WRAPPER], wasReady: false }
  it.each<[string, Partial<Run>, string | undefined]>([
    ["exit code 1", {}, "raise gpu_memory_utilization"],
    [
      "killed by a signal (SGLang SIGKILLs its own tree)",
      { code: null, signal: "SIGKILL" },
      "raise gpu_memory_utilization"
    ],
    ["no exit status known", { code: null }, "raise gpu_memory_utilization"],
    ["a clean exit 0", { code: 0 }, undefined],
    ["stopped by the agent", { endedBy: { kind: "stopped" }, code: null, signal: "SIGTERM" }, undefined],
    [
      "killed after a startup timeout",
      { endedBy: { kind: "startupTimeout" }, code: null, signal: "SIGKILL" },
      undefined
    ],
    [
      "killed as unhealthy",
      { endedBy: { kind: "unhealthy", reason: "3 liveness probes failed in a row" }, code: 0 },
      undefined
    ],
    // a cause line kept from its start (keepLine) must not be told as the cause of a crash hours into serving
    ["a run that was ready, then crashed", { wasReady: true }, undefined]
  ])("%s", (_name, over, want) => {
    expect(exitHint(TABLE, { ...run, ...over })).toBe(want)
  })

  it("no table (mlx, openai_compat): nothing", () => {
    expect(exitHint(undefined, run)).toBeUndefined()
    expect(exitHint([], run)).toBeUndefined()
  })
})

describe("the hint where an exit is told", () => {
  const exit = (hint: string | undefined): ExitRecord => ({
    run: 2,
    pid: 42,
    code: 1,
    signal: null,
    startedAt: 0,
    endedAt: 1500,
    runtimeMs: 1500,
    reason: "exited",
    endedBy: { kind: "exited" },
    lastLines: [NO_KV],
    oomKills: undefined,
    memoryLimitBytes: undefined,
    ...(hint === undefined ? {} : { hint })
  })
  const HINT = 'raise models."m".gpu_memory_utilization'

  it("describeExit appends it, and says nothing without one", () => {
    expect(describeExit(exit(HINT))).toBe(`run 2 (pid 42) ended: exited, exit code 1, after 1.5 s; hint: ${HINT}`)
    expect(describeExit(exit(undefined))).toBe("run 2 (pid 42) ended: exited, exit code 1, after 1.5 s")
  })

  it("failingReason (the crash-loop reason) carries it", () => {
    const plan = { attempt: 3, unstableRuns: 3, delayMs: 4000, crashLoop: true }
    expect(failingReason(plan, exit(HINT))).toBe(
      `engine failing: 3 runs in a row ended before being stable, the last: exited (exit code 1); hint: ${HINT}; ` +
        "still retrying with backoff"
    )
    expect(failingReason(plan, exit(undefined))).not.toContain("hint")
  })

  it("/status's exit has it, null when none", () => {
    expect(exitForensics(exit(HINT)).hint).toBe(HINT)
    expect(exitForensics(exit(undefined)).hint).toBeNull()
  })
})

describe("keepLine: a run's last lines, a cause line kept past a long traceback", () => {
  const feed = (lines: ReadonlyArray<string>, max: number, table: ReadonlyArray<ExitHint> | undefined) =>
    lines.reduce<ReadonlyArray<KeptLine>>((kept, l) => keepLine(kept, l, max, table), []).map((l) => l.text)
  const frames = (n: number) => Array.from({ length: n }, (_, i) => `[stderr]   File "x.py", line ${i}`)

  it("without a cause, the newest `max` lines, in order", () => {
    expect(feed(["a", "b", "c", "d"], 3, TABLE)).toEqual(["b", "c", "d"])
    expect(feed(["a", "b"], 3, undefined)).toEqual(["a", "b"])
  })

  it("the cause line stays while 40 newer lines come (vLLM's API-server traceback), and the hint is read from it", () => {
    const kept = feed(["[stdout] loading", NO_KV, ...frames(40), WRAPPER], 10, TABLE)
    expect(kept).toHaveLength(10)
    expect(kept[0]).toBe(NO_KV)
    expect(kept.slice(1)).toEqual([...frames(40).slice(-8), WRAPPER])
    expect(matchHint(TABLE, kept)).toBe("raise gpu_memory_utilization")
    // a plain ring (no table) loses it
    expect(feed(["[stdout] loading", NO_KV, ...frames(40), WRAPPER], 10, undefined)).not.toContain(NO_KV)
  })

  // pinned as a value: counted with the constant, the test would follow any change to it
  it("at most 4 cause lines are kept past the count, the newest of them", () => {
    const causes = Array.from({ length: 6 }, (_, i) => `${OOM} (${i})`)
    const kept = feed([...causes, ...frames(20)], 8, TABLE)
    expect(kept).toHaveLength(8)
    expect(kept.slice(0, 4)).toEqual(causes.slice(2))
    expect(kept.slice(4)).toEqual(frames(20).slice(-4))
  })
})
