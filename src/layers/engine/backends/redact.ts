/**
 * Redaction of secrets in a LaunchPlan before it is printed or logged: env values whose name looks like a
 * credential, a header list's values, a URL's password, the value of a secret flag (the rule:
 * services/engine/Secrets.ts) and the engine's Authorization header (engine.api_key). The plan that is spawned is never redacted; only copies made for humans go through
 * here. Pure.
 */
import type { LaunchPlan } from "../../../services/engine/Engine.ts"
import { REDACTED, redactArg, redactEnvValue } from "../../../services/engine/Secrets.ts"

export { REDACTED }

/** The argv with the value of every secret flag (`--api-key V` or `--api-key=V`) and URL password replaced. */
export const redactArgv = (argv: ReadonlyArray<string>): ReadonlyArray<string> => argv.map((_, i) => redactArg(argv, i))

/** The env with every secret replaced; the rest of each value, a header list's keys among it, is shown. */
export const redactEnv = (env: Readonly<Record<string, string>>): Readonly<Record<string, string>> =>
  Object.fromEntries(Object.entries(env).map(([k, v]) => [k, redactEnvValue(k, v)]))

/** The engine's Authorization header (engine.api_key) with its credential replaced, wherever the plan holds it. */
const redactAuthorization = <T extends { readonly authorization?: string }>(o: T): T =>
  o.authorization === undefined ? o : { ...o, authorization: `Bearer ${REDACTED}` }

/** A copy of the plan that is safe to print. */
export const redactPlan = (plan: LaunchPlan): LaunchPlan => ({
  ...redactAuthorization(plan),
  argv: redactArgv(plan.argv),
  env: redactEnv(plan.env),
  probe: redactAuthorization(plan.probe),
  ...(plan.liveness === undefined ? {} : { liveness: redactAuthorization(plan.liveness) })
})
