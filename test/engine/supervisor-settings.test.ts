// The supervisor's settings from the config (layers/engine/supervisorSettings.ts): the restart backoff as configured
// for an engine the agent spawns, and at most engine.liveness_interval for a server it only proxies (openai_compat),
// whose "restart" is a new probe that a longer wait would only keep from seeing the server back.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfigObject } from "../../src/layers/config/Config.ts"
import { settingsFromConfig } from "../../src/layers/engine/supervisorSettings.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"

const config = (engine: Record<string, unknown>): AgentConfig => {
  const r = decodeConfigObject({ agent: { node_id: "n1" }, engine, models: { m: { hf_repo: "org/m" } } }, undefined, {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}
const delays = (engine: Record<string, unknown>) => {
  const { initialMs, maxMs } = settingsFromConfig(config(engine)).backoff
  return [initialMs, maxMs]
}

describe("the restart backoff", () => {
  it("an engine the agent spawns: as configured (README defaults 1s, 5m)", () => {
    expect(delays({ kind: "vllm" })).toEqual([1_000, 300_000])
    expect(delays({ kind: "vllm", restart_backoff_initial: "10s", liveness_interval: "2s" })).toEqual([10_000, 300_000])
  })

  it("a proxied server (openai_compat): at most engine.liveness_interval", () => {
    expect(delays({ kind: "openai_compat" })).toEqual([1_000, 5_000])
    expect(delays({ kind: "openai_compat", restart_backoff_initial: "10s", liveness_interval: "2s" })).toEqual([
      2_000, 2_000
    ])
    expect(delays({ kind: "openai_compat", restart_backoff_max: "3s" })).toEqual([1_000, 3_000])
  })
})
