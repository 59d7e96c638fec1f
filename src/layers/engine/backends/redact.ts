/**
 * Redaction of secrets in a LaunchPlan before it is printed or logged: env values whose name looks like a
 * credential and the value of a secret flag (the rule: services/engine/Secrets.ts). The plan that is spawned is
 * never redacted; only copies made for humans go through here. Pure.
 */
import type { LaunchPlan } from "../../../services/engine/Engine.ts"
import { isSecretName, REDACTED, secretOffset } from "../../../services/engine/Secrets.ts"

export { REDACTED }

/** The argv with the value of every secret flag (`--api-key V` or `--api-key=V`) replaced. */
export const redactArgv = (argv: ReadonlyArray<string>): ReadonlyArray<string> =>
  argv.map((arg, i) => {
    const at = secretOffset(argv, i)
    return at === undefined ? arg : `${arg.slice(0, at)}${REDACTED}`
  })

/** The env with every secret-looking value replaced. */
export const redactEnv = (env: Readonly<Record<string, string>>): Readonly<Record<string, string>> =>
  Object.fromEntries(Object.entries(env).map(([k, v]) => [k, isSecretName(k) ? REDACTED : v]))

/** A copy of the plan that is safe to print. */
export const redactPlan = (plan: LaunchPlan): LaunchPlan => ({
  ...plan,
  argv: redactArgv(plan.argv),
  env: redactEnv(plan.env)
})
