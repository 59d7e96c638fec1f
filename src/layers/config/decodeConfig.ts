/**
 * TOML text (or an already-parsed object) to the resolved AgentConfig: parse, decode with ConfigSchema,
 * cross-check, then fill defaults (node id, lease TTL, admin token from the environment). Pure apart from
 * reading the host name; nothing half-parsed escapes: either every check passes or a ConfigError lists
 * every problem.
 */
import * as os from "node:os"
import { Duration, Result, Schema } from "effect"
import { parse as parseToml, TomlError } from "smol-toml"
import { type AgentConfig, ConfigError, type ModelConfig } from "../../services/config/Config.ts"
import { ConfigFile } from "../../services/config/ConfigSchema.ts"
import { crossChecks } from "./crossChecks.ts"
import { fieldProblems, unknownKeyProblems } from "./schemaProblems.ts"

/** Decodes TOML text into the resolved config, or every problem found, one line each. */
export const decodeConfig = (
  text: string,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  let raw: unknown
  try {
    raw = parseToml(text)
  } catch (e) {
    if (e instanceof TomlError) {
      const first = e.message.split("\n")[0] ?? e.message
      return Result.fail(new ConfigError({ file: name, problems: [`line ${e.line}, column ${e.column}: ${first}`] }))
    }
    throw e
  }
  return decodeConfigObject(raw, file, env)
}

/** Decodes an already-parsed object (the test layer and embedders use this). */
export const decodeConfigObject = (
  raw: unknown,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  const fail = (problems: ReadonlyArray<string>) =>
    Result.fail(new ConfigError({ file: name, problems: [...problems] }))
  const unknown = unknownKeyProblems(raw)
  const decoded = Schema.decodeUnknownExit(ConfigFile)(raw, { errors: "all" })
  if (decoded._tag === "Failure") return fail([...unknown, ...fieldProblems(raw)])
  if (unknown.length > 0) return fail(unknown)
  const parsed = decoded.value
  const problems = crossChecks(parsed)
  if (problems.length > 0) return fail(problems)
  return Result.succeed(resolve(parsed, file, env))
}

const resolve = (c: ConfigFile, file: string | undefined, env: Readonly<Record<string, string | undefined>>) => {
  const [name, m] = Object.entries(c.models)[0]!
  const model: ModelConfig = {
    name,
    source: m.hf_repo !== undefined ? { kind: "hf_repo", value: m.hf_repo } : { kind: "path", value: m.path! },
    tp: m.tp,
    dp: m.dp,
    served_name: m.served_name ?? name,
    max_model_len: m.max_model_len,
    gpu_memory_utilization: m.gpu_memory_utilization,
    args: m.args,
    gpus: m.gpus
  }
  const config: AgentConfig = {
    file,
    cluster: c.cluster,
    security: c.security,
    agent: {
      ...c.agent,
      node_id: c.agent.node_id ?? (env.NODE_NAME || os.hostname()),
      node_ip: env.NODE_IP?.trim() || undefined,
      lease_ttl: c.agent.lease_ttl ?? Duration.times(c.agent.heartbeat, 3),
      // A token is a secret: Kubernetes hands it over as an env var from a Secret, not in the ConfigMap.
      ...(c.agent.admin_token === undefined && env.CGN_AGENT_ADMIN_TOKEN
        ? { admin_token: env.CGN_AGENT_ADMIN_TOKEN }
        : {})
    },
    engine: c.engine,
    model,
    kv: c.kv
  }
  return config
}
