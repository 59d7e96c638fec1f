/**
 * A file's bytes (UTF-8 only), TOML text or an already-parsed object to the resolved AgentConfig: parse, check the
 * values as written (services/config/RawValues.ts), decode with ConfigSchema, cross-check, then fill defaults (node id, lease TTL,
 * admin token and engine API key from the environment). Pure apart from reading the host name; nothing half-parsed
 * escapes: either every check passes or a ConfigError lists every problem.
 */
import * as os from "node:os"
import { Result, Schema } from "effect"
import { parse as parseToml, TomlError } from "smol-toml"
import { type AgentConfig, ConfigError, type ModelConfig } from "../../services/config/Config.ts"
import { ConfigFile, LogLevels } from "../../services/config/ConfigSchema.ts"
import { DialableHostPort, keyPartProblem } from "../../services/config/ConfigValues.ts"
import { type CheckedValues, checkValues } from "../../services/config/RawValues.ts"
import { fieldProblems, unknownKeyProblems } from "../../services/config/SchemaProblems.ts"
import { syntaxErrorKey } from "../../services/config/SyntaxErrorKey.ts"
import { joinHostPort } from "../../services/net/HostPort.ts"
import { agentFlagArgProblems } from "./agentFlagChecks.ts"
import { backoffOrderProblems, crossChecks, leaseTtlOf } from "./crossChecks.ts"
import { engineKeyProblems } from "./engineKeyChecks.ts"

/**
 * The file's text, or where its first byte that is not UTF-8 is (`line L, column C: ...`, the column in
 * characters): decoding with replacement would put U+FFFD into a value silently.
 */
const utf8Text = (bytes: Uint8Array): Result.Result<string, string> => {
  try {
    return Result.succeed(new TextDecoder("utf-8", { fatal: true }).decode(bytes))
  } catch {
    // Byte by byte to the first error; `start` is where the sequence that holds it began.
    const stream = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })
    let start = 0
    for (let i = 0; i <= bytes.length; i++) {
      try {
        const out = i < bytes.length ? stream.decode(bytes.subarray(i, i + 1), { stream: true }) : stream.decode()
        if (out !== "") start = i + 1
      } catch {
        break
      }
    }
    const before = bytes.subarray(0, start)
    const lineStart = before.lastIndexOf(0x0a) + 1
    const line = before.filter((b) => b === 0x0a).length + 1
    const column = [...new TextDecoder().decode(bytes.subarray(lineStart, start))].length + 1
    const byte = bytes[start]!.toString(16).padStart(2, "0")
    return Result.fail(
      `line ${line}, column ${column}: invalid UTF-8 (byte 0x${byte} at offset ${start}); save the file as UTF-8`
    )
  }
}

/** Decodes the bytes of a file: UTF-8 (refused with where its first bad byte is), then as decodeConfig. */
export const decodeConfigBytes = (
  bytes: Uint8Array,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> =>
  Result.match(utf8Text(bytes), {
    onFailure: (problem) => Result.fail(new ConfigError({ file: file ?? "<inline>", problems: [problem] })),
    onSuccess: (text) => decodeConfig(text, file, env)
  })

/**
 * A string left open (`node_id = "oncall-1` with no closing quote) runs into its line's end, which smol-toml reports
 * as the newline it met: "control characters are not allowed in strings", at the column just past the line's text
 * (squirrelchat/smol-toml src/primitive.ts parseString). Said so when the error sits there; a control character
 * inside a closed string is at another column and gets no hint.
 */
const unclosedStringHint = (text: string, line: number, column: number, message: string): string => {
  if (!message.endsWith("control characters are not allowed in strings")) return ""
  const at = text.split("\n")[line - 1]?.[column - 1]
  return at === undefined || at === "\r" ? " (a string not closed on its line?)" : ""
}

/** Decodes TOML text into the resolved config, or every problem found, one line each. */
export const decodeConfig = (
  text: string,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  let raw: unknown
  try {
    // Integers as bigint, so that a float (`tp = 1.0`) is told from an integer; services/config/RawValues.ts makes them numbers.
    raw = parseToml(text, { integersAsBigInt: true })
  } catch (e) {
    if (e instanceof TomlError) {
      const said = e.message.split("\n")[0] ?? e.message
      const first = `${said}${unclosedStringHint(text, e.line, e.column, said)}`
      const key = syntaxErrorKey(text, e.line)
      const where = `line ${e.line}, column ${e.column}`
      return Result.fail(
        new ConfigError({
          file: name,
          problems: [key === undefined ? `${where}: ${first}` : `${key}: ${where}: ${first}`]
        })
      )
    }
    throw e
  }
  return decodeChecked(checkValues(raw, true), file, env)
}

/** Decodes an already-parsed object (the test layer and embedders use this). */
export const decodeConfigObject = (
  raw: unknown,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>> = process.env
): Result.Result<AgentConfig, ConfigError> => decodeChecked(checkValues(raw, false), file, env)

/** A NUL printed raw would cut or garble the line it is in (and a terminal's): every problem shows it escaped. */
const escapeNul = (line: string): string => line.replaceAll("\0", "\\u0000")

const decodeChecked = (
  checked: CheckedValues,
  file: string | undefined,
  env: Readonly<Record<string, string | undefined>>
): Result.Result<AgentConfig, ConfigError> => {
  const name = file ?? "<inline>"
  const fail = (problems: ReadonlyArray<string>) =>
    Result.fail(new ConfigError({ file: name, problems: problems.map(escapeNul) }))
  const raw = checked.value
  const unknown = unknownKeyProblems(raw)
  const decoded = Schema.decodeUnknownExit(ConfigFile)(raw, { errors: "all" })
  // The schema's words on a key RawValues.ts refused say less (a NUL or a float it cannot see): left out.
  const onOtherKeys = (p: string) => ![...checked.keys].some((k) => [": ", ".", "["].some((s) => p.startsWith(k + s)))
  if (decoded._tag === "Failure")
    return fail([...unknown, ...checked.problems, ...fieldProblems(raw).filter(onOtherKeys)])
  if (unknown.length > 0 || checked.problems.length > 0) return fail([...unknown, ...checked.problems])
  const parsed = decoded.value
  const problems = crossChecks(parsed)
  problems.push(...backoffOrderProblems(parsed, setInFile(raw, "engine", "restart_backoff_initial")))
  // The schema checked a node_id written in the file; one from the environment is checked the same way here.
  const nodeId = parsed.agent.node_id ?? (env.NODE_NAME || os.hostname())
  const badId = parsed.agent.node_id === undefined ? keyPartProblem(nodeId) : undefined
  if (badId !== undefined) {
    const from = env.NODE_NAME ? "NODE_NAME" : "the hostname"
    problems.push(`agent.node_id: not set, so it comes from ${from}: ${badId}; set agent.node_id`)
  }
  // CGN_LOG_LEVEL overrides agent.log_level (layers/observability/Logging.ts); a value that names no level would
  // be passed over without a word, leaving the level the operator meant to replace.
  const envLevel = env.CGN_LOG_LEVEL
  if (envLevel && !LogLevels.some((l) => l === envLevel.toLowerCase())) {
    problems.push(
      `CGN_LOG_LEVEL: expected ${LogLevels.map((l) => `"${l}"`).join(", ")} (it overrides agent.log_level), got ${JSON.stringify(envLevel)}; fix or unset it`
    )
  }
  // NODE_IP (the downward API's status.hostIP) is published as this node's address unless advertise_addr is set,
  // and is vLLM's NIXL side-channel host: checked as advertise_addr is, or a router would dial a malformed one.
  const nodeIp = nodeIpOf(env)
  if (nodeIp !== undefined) {
    const dialable = Schema.decodeUnknownExit(DialableHostPort)(joinHostPort(nodeIp, 1))
    if (dialable._tag === "Failure") {
      problems.push(
        `NODE_IP: expected this host's IP address or DNS name (Kubernetes: status.hostIP), got ${JSON.stringify(nodeIp)}; fix or unset it`
      )
    }
  }
  const token = bearerOf("agent.admin_token", "CGN_AGENT_ADMIN_TOKEN", parsed.agent.admin_token, env)
  if (token.problem !== undefined) problems.push(token.problem)
  const engineKey = bearerOf("engine.api_key", "CGN_AGENT_ENGINE_API_KEY", parsed.engine.api_key, env)
  if (engineKey.problem !== undefined) problems.push(engineKey.problem)
  problems.push(...engineKeyProblems(parsed, engineKey.value === undefined ? undefined : engineKey.key, env))
  problems.push(...agentFlagArgProblems(parsed))
  if (problems.length > 0) return fail(problems)
  return Result.succeed(resolve(parsed, nodeId, file, nodeIp, token.value, engineKey.value))
}

/**
 * A bearer token from the file's `key`, else the variable `envName` (Kubernetes hands a secret over as an env var from
 * a Secret): agent.admin_token, engine.api_key. A bearer token is one word (RFC 6750): the whitespace around it (the
 * trailing newline of a Secret made from a file) is trimmed, as client-go trims token files; whitespace or a control
 * character inside could never be sent, and every request would be answered 401 without saying why.
 */
const bearerOf = (
  fileKey: string,
  envName: string,
  fromFile: string | undefined,
  env: Readonly<Record<string, string | undefined>>
): { readonly key: string; readonly value?: string; readonly problem?: string } => {
  const [key, raw] = fromFile !== undefined ? [fileKey, fromFile] : [envName, env[envName] || undefined]
  if (raw === undefined) return { key }
  const value = raw.trim()
  if (value === "") return { key, problem: `${key}: only whitespace; set a token or remove it` }
  if (/[\s\x00-\x1f\x7f]/.test(value))
    return {
      key,
      problem: `${key}: whitespace or a control character inside the token, which an Authorization header cannot carry (every request would be refused 401)`
    }
  return { key, value }
}

/** Whether the file itself sets `section.key` (a default the schema filled in is not the operator's word). */
const setInFile = (raw: unknown, section: string, key: string): boolean => {
  const table = typeof raw === "object" && raw !== null ? (raw as Record<string, unknown>)[section] : undefined
  return typeof table === "object" && table !== null && (table as Record<string, unknown>)[key] !== undefined
}

const nodeIpOf = (env: Readonly<Record<string, string | undefined>>): string | undefined =>
  env.NODE_IP?.trim() || undefined

const resolve = (
  c: ConfigFile,
  nodeId: string,
  file: string | undefined,
  nodeIp: string | undefined,
  adminToken: string | undefined,
  engineKey: string | undefined
) => {
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
      node_id: nodeId,
      node_ip: nodeIp,
      lease_ttl: leaseTtlOf(c.agent),
      ...(adminToken === undefined ? {} : { admin_token: adminToken })
    },
    engine: engineKey === undefined ? c.engine : { ...c.engine, api_key: engineKey },
    model,
    kv: c.kv
  }
  return config
}
