// A duration written as a TOML number, boolean, array or table (`heartbeat = 5`) is said as a bad duration string is
// (`expected a duration such as "500ms", ...`, README's exit codes), with the quoted form and, for a number, the string
// to write; the schema's own words were `Expected string, got 5`. Every duration key, found by what it says of a
// string that is no duration, so a key added later is covered too; other keys keep their messages.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { knownKeys } from "../../src/services/config/ConfigSchema.ts"

const MODEL = '[models.m]\nhf_repo = "a/b"\n'
const EXPECTED = 'expected a duration such as "500ms", "5s", "2m" or "1h"'

const problemsOf = (text: string): ReadonlyArray<string> => {
  const r = decodeConfig(text, "bad.toml", {})
  return Result.isFailure(r) ? r.failure.problems : []
}

/** `section.key = value` in an otherwise minimal file (a model key in the model's table). */
const fileWith = (section: string, key: string, value: string) =>
  section === "model" ? `${MODEL}${key} = ${value}\n` : `[${section}]\n${key} = ${value}\n${MODEL}`
const where = (section: string, key: string) => (section === "model" ? `models."m".${key}` : `${section}.${key}`)

const durationKeys = Object.entries(knownKeys)
  .filter(([section]) => section !== "")
  .flatMap(([section, keys]) => keys.map((key) => [section, key] as const))
  .filter(([section, key]) =>
    problemsOf(fileWith(section, key, '"soon"')).includes(`${where(section, key)}: ${EXPECTED}, got "soon"`)
  )

describe("a duration not written as a string", () => {
  it("finds the duration keys", () => {
    expect(durationKeys.map(([s, k]) => `${s}.${k}`)).toEqual(
      expect.arrayContaining([
        "agent.heartbeat",
        "agent.drain_timeout",
        "agent.lease_ttl",
        "agent.keepalive_time",
        "agent.handoff_timeout",
        "engine.stop_grace",
        "engine.stall_restart_after"
      ])
    )
    // the 18 of today (grep ShortDuration, PositiveDuration, OffOrAtLeast in ConfigSchema.ts)
    expect(durationKeys.length).toBeGreaterThanOrEqual(18)
  })

  it.each(durationKeys)("%s.%s = 5 names the duration and the string to write", (section, key) => {
    // 5 is no duration any key refuses as a string ("5s"), so every key gets the fix
    expect(problemsOf(fileWith(section, key, "5"))).toEqual([
      `${where(section, key)}: ${EXPECTED} (a quoted string with a unit), got 5: write "5s"`
    ])
  })

  it.each(durationKeys)("%s.%s as a boolean, an array or a table names the duration", (section, key) => {
    for (const [value, shown] of [
      ["true", "true"],
      ["[1]", "an array"],
      ["{ a = 1 }", "a table"]
    ]) {
      expect(problemsOf(fileWith(section, key, value!))).toEqual([
        `${where(section, key)}: ${EXPECTED} (a quoted string with a unit), got ${shown}`
      ])
    }
  })

  it("suggests the number with a unit only where the key takes it", () => {
    expect(problemsOf(`[agent]\nheartbeat = 5.5\n${MODEL}`)).toEqual([
      `agent.heartbeat: ${EXPECTED} (a quoted string with a unit), got 5.5: write "5.5s"`
    ])
    // "0s" is refused by a duration above 0, and "-5s" is no duration: no string to write
    expect(problemsOf(`[agent]\nhandoff_timeout = 0\n${MODEL}`)).toEqual([
      `agent.handoff_timeout: ${EXPECTED} (a quoted string with a unit), got 0`
    ])
    expect(problemsOf(`[agent]\ndrain_timeout = -5\n${MODEL}`)).toEqual([
      `agent.drain_timeout: ${EXPECTED} (a quoted string with a unit), got -5`
    ])
    expect(problemsOf(`[agent]\ndrain_timeout = 30\n${MODEL}`)).toEqual([
      `agent.drain_timeout: ${EXPECTED} (a quoted string with a unit), got 30: write "30s"`
    ])
    // "0s" passes the key's own schema but not the heartbeat's floor (100ms): no suggestion the config then refuses
    expect(problemsOf(`[agent]\nheartbeat = 0\n${MODEL}`)).toEqual([
      `agent.heartbeat: ${EXPECTED} (a quoted string with a unit), got 0`
    ])
    // 30000 was most likely meant in milliseconds: not "30000s" (8 h 20 min)
    expect(problemsOf(`[agent]\ndrain_timeout = 30000\n${MODEL}`)).toEqual([
      `agent.drain_timeout: ${EXPECTED} (a quoted string with a unit), got 30000`
    ])
  })

  it("reports every bad key of the file at once, each with its own words", () => {
    expect(problemsOf(`[agent]\nheartbeat = 5\ndrain_timeout = true\nmax_inflight = "256"\n${MODEL}`)).toEqual([
      `agent.heartbeat: ${EXPECTED} (a quoted string with a unit), got 5: write "5s"`,
      'agent.max_inflight: expected an integer such as 256 (a TOML number, without quotes), got "256"',
      `agent.drain_timeout: ${EXPECTED} (a quoted string with a unit), got true`
    ])
  })

  it("leaves other keys' wrong types as they were", () => {
    expect(problemsOf(`[agent]\nlisten_grpc = 5\n${MODEL}`)).toEqual(["agent.listen_grpc: expected a string, got 5"])
    expect(problemsOf(`[agent]\nnode_id = true\n${MODEL}`)).toEqual(["agent.node_id: expected a string, got true"])
    expect(problemsOf(`[engine]\nurl = 8000\n${MODEL}`)).toEqual(["engine.url: expected a string, got 8000"])
    expect(problemsOf(`[agent]\nheartbeat = "5"\n${MODEL}`)).toEqual([`agent.heartbeat: ${EXPECTED}, got "5"`])
  })
})
