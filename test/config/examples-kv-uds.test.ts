// An example that turns KV events on must say where they go: without `[kv].uds` the engine publishes them, `run`
// warns "nothing forwards them to kvcached" and the KV bridge stays off (sglang-hicache.toml shipped that way).
import * as fs from "node:fs"
import * as path from "node:path"
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"

const DIR = path.join(import.meta.dirname, "..", "..", "examples")
const files = fs.readdirSync(DIR).filter((f) => f.endsWith(".toml"))

describe("examples with KV events", () => {
  const withEvents = files.filter((name) => {
    const r = decodeConfig(fs.readFileSync(path.join(DIR, name), "utf8"), name, {})
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    return r.success.kv.events
  })

  it("there are some", () => {
    expect(withEvents.length).toBeGreaterThan(0)
  })

  it.each(withEvents)("%s names the cgn-kvcached socket they are forwarded to", (name) => {
    const r = decodeConfig(fs.readFileSync(path.join(DIR, name), "utf8"), name, {})
    expect(Result.isSuccess(r) ? r.success.kv.uds : undefined).toBeDefined()
  })
})
