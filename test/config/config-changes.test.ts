// What a SIGHUP leaves for the next start (layers/config/configChanges.ts): the keys whose values differ between
// the running config and the file read again, as TOML key paths, without agent.log_level (which it applies).
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { unappliedChanges } from "../../src/layers/config/configChanges.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"

const BASE =
  '[agent]\nlog_level = "info"\nmax_inflight = 4\n[engine]\nstop_grace = "5s"\n[models."m"]\nhf_repo = "a/b"\n'

const decoded = (text: string): AgentConfig => {
  const r = decodeConfig(text, "agent.toml", { NODE_NAME: "n1" })
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

describe("unappliedChanges", () => {
  it.each([
    ["nothing changed", BASE, []],
    ["the log level alone: applied, so not named", BASE.replace('"info"', '"debug"'), []],
    ["an int", BASE.replace("max_inflight = 4", "max_inflight = 2"), ["agent.max_inflight"]],
    // lease_ttl's default is 3 x heartbeat: the operator changed only the heartbeat
    [
      "a key another's default derives from",
      BASE.replace("max_inflight = 4", 'max_inflight = 4\nheartbeat = "2s"'),
      ["agent.heartbeat"]
    ],
    [
      "the derived key written itself",
      BASE.replace("max_inflight = 4", 'max_inflight = 4\nlease_ttl = "20s"'),
      ["agent.lease_ttl"]
    ],
    ["a duration, written another way but equal", BASE.replace('"5s"', '"5000ms"'), []],
    ["a duration that differs", BASE.replace('"5s"', '"6s"'), ["engine.stop_grace"]],
    ["a key in a table the file did not have", `${BASE}[kv]\nmax_queue_bytes = 1\n`, ["kv.max_queue_bytes"]],
    ["a model's key", `${BASE}tp = 2\n`, ['models."m".tp']],
    ["an array", `${BASE}args = ["--x"]\n`, ['models."m".args']],
    ["the model renamed", BASE.replace('[models."m"]', '[models."k"]'), ["models"]],
    [
      "several, with the log level among them",
      BASE.replace('"info"', '"warn"').replace("max_inflight = 4", "max_inflight = 3").replace('"5s"', '"1s"'),
      ["agent.max_inflight", "engine.stop_grace"]
    ]
  ] as const)("%s", (_what, after, keys) => {
    expect(unappliedChanges(decoded(BASE), decoded(after))).toEqual(keys)
  })
})
