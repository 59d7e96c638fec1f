/** Supervisor settings for tests that drive the watch or the supervisor on a TestClock; override what a test needs. */
import type { SupervisorSettings } from "../../src/layers/engine/supervisorSettings.ts"

export const testSettings = (overrides: Partial<SupervisorSettings> = {}): SupervisorSettings => ({
  startupTimeoutMs: 60_000,
  stopGraceMs: 500,
  livenessIntervalMs: 5_000,
  livenessFailures: 3,
  backoff: { initialMs: 1_000, maxMs: 30_000, stableAfterMs: 600_000, crashLoopAfter: 3 },
  stateDir: "/nonexistent",
  verifyListener: true,
  probeIntervalMs: 500,
  progressEveryMs: 5_000,
  linesKept: 50,
  ...overrides
})
