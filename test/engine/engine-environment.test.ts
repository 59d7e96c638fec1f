// The engine's environment: the agent's less its own settings (MALLOC_ARENA_MAX, CGN_AGENT_*), plus the plan's.
import { describe, expect, it } from "vitest"
import { AGENT_PROCESS_VARIABLES, engineEnvironment } from "../../src/services/engine/EngineEnvironment.ts"

describe("engineEnvironment", () => {
  it("passes the agent's environment on, less the agent process's allocator setting", () => {
    const env = engineEnvironment({ PATH: "/usr/bin", HOME: "/home/a", MALLOC_ARENA_MAX: "1" }, {})
    expect(env).toEqual({ PATH: "/usr/bin", HOME: "/home/a" })
    expect(AGENT_PROCESS_VARIABLES).toContain("MALLOC_ARENA_MAX")
  })

  it("adds the plan's variables over the agent's, [engine].env's MALLOC_ARENA_MAX included", () => {
    const env = engineEnvironment(
      { PATH: "/usr/bin", CUDA_VISIBLE_DEVICES: "0,1", MALLOC_ARENA_MAX: "1" },
      { CUDA_VISIBLE_DEVICES: "1", MALLOC_ARENA_MAX: "4" }
    )
    expect(env).toEqual({ PATH: "/usr/bin", CUDA_VISIBLE_DEVICES: "1", MALLOC_ARENA_MAX: "4" })
  })

  it("does not pass on the agent's own settings (CGN_AGENT_*: the admin token), unless the plan sets one", () => {
    const agent = { PATH: "/usr/bin", CGN_AGENT_ADMIN_TOKEN: "adm", CGN_AGENT_CONFIG: "/etc/a.toml", CGN_AGENTX: "k" }
    expect(engineEnvironment(agent, {})).toEqual({ PATH: "/usr/bin", CGN_AGENTX: "k" })
    expect(engineEnvironment(agent, { CGN_AGENT_CONFIG: "/e.toml" })).toEqual({
      PATH: "/usr/bin",
      CGN_AGENTX: "k",
      CGN_AGENT_CONFIG: "/e.toml"
    })
    expect(AGENT_PROCESS_VARIABLES).toContain("CGN_AGENT_*")
  })

  it("a family is a prefix: a name that only contains one (MY_OTEL_X, APP_CGN_AGENT_Y) is passed on", () => {
    const agent = { MY_OTEL_X: "1", APP_CGN_AGENT_Y: "2", OTEL_X: "3", CGN_AGENT_Y: "4" }
    expect(engineEnvironment(agent, {})).toEqual({ MY_OTEL_X: "1", APP_CGN_AGENT_Y: "2" })
  })

  it("leaves the agent's environment object as it was", () => {
    const agent = { MALLOC_ARENA_MAX: "1", A: "x" }
    engineEnvironment(agent, { B: "y" })
    expect(agent).toEqual({ MALLOC_ARENA_MAX: "1", A: "x" })
  })
})

describe("engineEnvironment and the agent's OpenTelemetry settings", () => {
  it("passes none of the agent's OTEL_* (its collector's credentials among them), unless the plan sets one", () => {
    const agent = {
      PATH: "/usr/bin",
      OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector:4318",
      OTEL_EXPORTER_OTLP_HEADERS: "authorization=Bearer otel_SECRET1",
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: "x-api-key=otel_SECRET2",
      OTEL_SERVICE_NAME: "cgn-agent"
    }
    expect(engineEnvironment(agent, {})).toEqual({ PATH: "/usr/bin" })
    expect(engineEnvironment(agent, { OTEL_SERVICE_NAME: "vllm" })).toEqual({
      PATH: "/usr/bin",
      OTEL_SERVICE_NAME: "vllm"
    })
    expect(AGENT_PROCESS_VARIABLES).toContain("OTEL_*")
  })
})
