/**
 * What a SIGHUP does not apply. A SIGHUP re-reads the config file for `agent.log_level` only (the TLS files are
 * re-read by content at the paths the agent started with); every other change takes effect at the next start. An
 * operator who edits `max_inflight` and sends SIGHUP saw only `log level info -> info` and took the change as made
 * (a chaos soak's finding), so the reload names the keys it leaves for the next start. Key names only, never values:
 * a change may be a password or a token.
 */
import { Duration, Effect, Result } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { formatPath } from "../../services/config/SchemaProblems.ts"
import { loadConfigFile } from "./Config.ts"

/** Keys a SIGHUP applies (layers/observability/Logging.ts hangupReload). */
const RELOADED = new Set(["agent.log_level"])

/**
 * Resolved keys whose default derives from another key: named only when that one did not change too (a new
 * heartbeat moves the default lease_ttl, 3 x heartbeat, which the operator never wrote).
 */
const DERIVED: Readonly<Record<string, string>> = { "agent.lease_ttl": "agent.heartbeat" }

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" &&
  v !== null &&
  (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null)

const same = (a: unknown, b: unknown): boolean => {
  if (Duration.isDuration(a) && Duration.isDuration(b)) return Duration.equals(a, b)
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => same(x, b[i]))
  if (isPlainObject(a) && isPlainObject(b)) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)])
    return [...keys].every((k) => same(a[k], b[k]))
  }
  return Object.is(a, b)
}

/** Where the differing values are, as key paths of the resolved config (tables recursed, arrays whole). */
const differences = (a: unknown, b: unknown, path: ReadonlyArray<string>, out: Array<ReadonlyArray<string>>): void => {
  if (isPlainObject(a) && isPlainObject(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) differences(a[k], b[k], [...path, k], out)
  } else if (!same(a, b)) out.push(path)
}

/**
 * The TOML key paths whose values differ between the running config and one read again, that a SIGHUP does not
 * apply, in the resolved config's order (cluster, security, agent, engine, models, kv), not the file's. The resolved `model` is the file's `models."<name>"` table (a renamed model: `models`).
 */
export const unappliedChanges = (running: AgentConfig, reread: AgentConfig): ReadonlyArray<string> => {
  const { file: _a, model: modelA, ...restA } = running
  const { file: _b, model: modelB, ...restB } = reread
  const paths: Array<ReadonlyArray<string>> = []
  differences(restA, restB, [], paths)
  const keys = paths.map((p) => formatPath(p))
  if (modelA.name !== modelB.name) keys.push("models")
  else {
    const modelPaths: Array<ReadonlyArray<string>> = []
    differences(modelA, modelB, [], modelPaths)
    for (const p of modelPaths) keys.push(formatPath(["models", modelA.name, ...p]))
  }
  return keys.filter((k) => !RELOADED.has(k) && !(DERIVED[k] !== undefined && keys.includes(DERIVED[k])))
}

/** On SIGHUP: a warning naming the changed keys left for the next start; nothing when there are none or the file no longer decodes (the log level's reload says so). */
export const hangupNotice = (running: AgentConfig): Effect.Effect<void> =>
  running.file === undefined
    ? Effect.void
    : Effect.flatMap(Effect.result(loadConfigFile(running.file)), (read) => {
        if (Result.isFailure(read)) return Effect.void
        const keys = unappliedChanges(running, read.success)
        return keys.length === 0
          ? Effect.void
          : Effect.logWarning(
              `SIGHUP: ${keys.length === 1 ? "a change" : "changes"} to ${keys.join(", ")} in ${running.file} ` +
                `${keys.length === 1 ? "takes" : "take"} effect at the agent's next start ` +
                "(a SIGHUP applies agent.log_level and re-reads the TLS files only; an engine restart keeps the running config)",
              { keys }
            )
      })
