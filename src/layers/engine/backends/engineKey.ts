/**
 * `engine.api_key` on a rendered plan (pure): the `Authorization` header of the agent's requests to the engine, on the
 * probes that ask the engine itself, and the key handed to an engine the agent spawns as its capabilities say (a
 * variable of its environment, else a flag). The config has already refused a key for an engine that takes none and
 * any other key given to the engine (layers/config/engineKeyChecks.ts), so the engine and the agent hold the same one.
 */
import type { EngineCapabilities, LaunchPlan, ReadinessProbe } from "../../../services/engine/Engine.ts"

/**
 * The probe with the engine's header when it asks the engine's own origin: a `ready_probe_url` on another host (a
 * sidecar, a gateway) is not handed the engine's key.
 */
const probeWith = (probe: ReadinessProbe, origin: string, authorization: string): ReadinessProbe =>
  URL.parse(probe.url)?.origin === origin ? { ...probe, authorization } : { ...probe, keyWithheld: true }

export const withEngineKey = (
  plan: LaunchPlan,
  capabilities: EngineCapabilities,
  key: string | undefined
): LaunchPlan => {
  if (key === undefined) return plan
  const authorization = `Bearer ${key}`
  const origin = new URL(plan.baseUrl).origin
  const via = plan.spawns ? capabilities.apiKey?.via : undefined
  return {
    ...plan,
    authorization,
    probe: probeWith(plan.probe, origin, authorization),
    ...(plan.liveness === undefined ? {} : { liveness: probeWith(plan.liveness, origin, authorization) }),
    ...(via === undefined
      ? {}
      : "env" in via
        ? { env: { ...plan.env, [via.env]: key } }
        : { argv: [...plan.argv, via.flag, key] })
  }
}
