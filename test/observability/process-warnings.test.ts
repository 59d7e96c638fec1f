// Node's process warnings as the agent's log lines (src/layers/observability/processWarnings.ts): while the layer is
// up, a warning (DEP0123, which grpc-js raises for an etcd https endpoint given by IP) is logged, not printed by Node as
// plain text between the JSON lines; Node's printer is back once the layer is released.
import { Effect, Exit, Layer, Logger, Scope } from "effect"
import { describe, expect, it, onTestFinished } from "vitest"
import * as ProcessWarnings from "../../src/layers/observability/processWarnings.ts"

describe("process warnings", () => {
  it("are logged while the layer is up, and Node's own printer is set aside until it is released", async () => {
    const logs: Array<{ level: string; message: unknown }> = []
    const logger = Logger.make(({ logLevel, message }) => void logs.push({ level: logLevel, message }))
    const node = process.listeners("warning")
    expect(node.length).toBeGreaterThan(0)
    const scope = await Effect.runPromise(Scope.make())
    // Released however the test ends: the files after it in this worker get Node's printer back.
    onTestFinished(() => Effect.runPromise(Scope.close(scope, Exit.void)))
    await Effect.runPromise(
      Layer.buildWithScope(ProcessWarnings.layer.pipe(Layer.provide(Logger.layer([logger]))), scope)
    )
    expect(process.listeners("warning").some((l) => node.includes(l))).toBe(false)
    const seen = new Promise<void>((r) => process.once("warning", () => setImmediate(r)))
    process.emitWarning("Setting the TLS ServerName to an IP address is not permitted", "DeprecationWarning", "DEP0123")
    await seen
    expect(logs).toHaveLength(1)
    expect(logs[0]?.level).toBe("Warn")
    expect(JSON.stringify(logs[0]?.message)).toContain("node: Setting the TLS ServerName to an IP address")
    expect(JSON.stringify(logs[0]?.message)).toContain("DEP0123")
    // the warning's class (its name), as its own field, beside its code
    expect(logs[0]?.message).toEqual([
      "node: Setting the TLS ServerName to an IP address is not permitted",
      { warning: "DeprecationWarning", code: "DEP0123" }
    ])
    await Effect.runPromise(Scope.close(scope, Exit.void))
    expect(process.listeners("warning")).toEqual(node)
  })
})
