/**
 * Redaction of secrets in a LaunchPlan before it is printed or logged: env values whose name looks
 * like a credential and the value after a token/key flag. The plan that is spawned is never redacted;
 * only copies made for humans go through here. Pure.
 */
import type { LaunchPlan } from "../../../services/engine/Engine.ts"

/** What replaces a secret. */
export const REDACTED = "<redacted>"

/** Env names whose values are secrets (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, ...). */
export const isSecretEnvName = (name: string): boolean => /(TOKEN|SECRET|PASSWORD|API_KEY|_KEY$)/i.test(name)

const SECRET_FLAGS = ["--api-key", "--hf-token", "--token"]

/** The argv with the value of every secret flag (`--api-key V` or `--api-key=V`) replaced. */
export const redactArgv = (argv: ReadonlyArray<string>): ReadonlyArray<string> =>
  argv.map((arg, i) => {
    const prev = argv[i - 1]
    if (prev !== undefined && SECRET_FLAGS.includes(prev)) return REDACTED
    const eq = arg.indexOf("=")
    if (eq > 0 && SECRET_FLAGS.includes(arg.slice(0, eq))) return `${arg.slice(0, eq)}=${REDACTED}`
    return arg
  })

/** The env with every secret-looking value replaced. */
export const redactEnv = (env: Readonly<Record<string, string>>): Readonly<Record<string, string>> =>
  Object.fromEntries(Object.entries(env).map(([k, v]) => [k, isSecretEnvName(k) ? REDACTED : v]))

/** A copy of the plan that is safe to print. */
export const redactPlan = (plan: LaunchPlan): LaunchPlan => ({
  ...plan,
  argv: redactArgv(plan.argv),
  env: redactEnv(plan.env)
})
