// API keys as each engine takes and checks them, as data per flavor: where its keys come from (flags, environment,
// a key file), which requests pass without one, how a request's headers carry one and how a refusal reads. The
// keys themselves are never logged. mlx-lm's server has no API key: its parser refuses the flag.
import type * as http from "node:http"
import type { Flavor } from "./simConfig.ts"
import type { StartDeath } from "./startFailures.ts"

/** One place keys come from, in the order the engine reads them: a list of keys, or a file of them. */
export type ApiKeySource =
  | { readonly keys: ReadonlyArray<string> }
  | { readonly file: string; readonly via: "--api-key-file" | "LLAMA_ARG_API_KEY_FILE" }

/**
 * llama.cpp's parse_csv_row (common/arg.cpp): comma-separated fields; a field that starts with `"` is quoted (`""`
 * inside is a quote, a comma inside is kept).
 */
const csv = (text: string): Array<string> => {
  const out: Array<string> = []
  let field = ""
  let quoted = false
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]
    if (ch === '"' && !quoted && field === "") quoted = true
    else if (ch === '"' && quoted && text[i + 1] === '"') {
      field += '"'
      i++
    } else if (ch === '"' && quoted) quoted = false
    else if (ch === "," && !quoted) {
      out.push(field)
      field = ""
    } else field += ch
  }
  out.push(field)
  return out
}

/** Every value given to `flag` (`--flag V` or `--flag=V`), in order; `many`: the words after it up to the next flag. */
const valuesOf = (words: ReadonlyArray<string>, flag: string, many = false): Array<string> => {
  const out: Array<string> = []
  words.forEach((w, i) => {
    if (w.startsWith(`${flag}=`)) out.push(w.slice(flag.length + 1))
    if (w !== flag) return
    for (let j = i + 1; j < words.length && !(words[j] ?? "-").startsWith("-"); j++) {
      out.push(words[j] ?? "")
      if (!many) break
    }
  })
  return out
}

const nonEmpty = (keys: ReadonlyArray<string>) => keys.filter((k) => k !== "")

/**
 * Where each engine's keys come from (mlx: nowhere).
 * - llama.cpp (common/arg.cpp): its environment is read before the command line, and `--api-key` (env LLAMA_API_KEY)
 *   and `--api-key-file` (env LLAMA_ARG_API_KEY_FILE) each add to the keys, so a key from the environment stays valid
 *   beside one from the flag (the "will be overwritten" warning notwithstanding); empty fields are skipped.
 * - vLLM (vllm/entrypoints/openai/api_server.py build_app): `args.api_key or [envs.VLLM_API_KEY]`, empty keys
 *   dropped; `--api-key` takes several (FrontendArgs `api_key: list[str] | None`).
 * - SGLang (python/sglang/srt/server_args.py): `--api-key`, one key, no environment.
 */
export const apiKeySources = (
  flavor: Flavor,
  words: ReadonlyArray<string>,
  env: Record<string, string | undefined>
): Array<ApiKeySource> => {
  switch (flavor) {
    case "llama_cpp": {
      const sources: Array<ApiKeySource> = []
      if (env.LLAMA_API_KEY !== undefined) sources.push({ keys: nonEmpty(csv(env.LLAMA_API_KEY)) })
      if (env.LLAMA_ARG_API_KEY_FILE !== undefined)
        sources.push({ file: env.LLAMA_ARG_API_KEY_FILE, via: "LLAMA_ARG_API_KEY_FILE" })
      words.forEach((w, i) => {
        const value = (flag: string) =>
          w === flag ? words[i + 1] : w.startsWith(`${flag}=`) ? w.slice(flag.length + 1) : undefined
        const key = value("--api-key")
        const file = value("--api-key-file")
        if (key !== undefined) sources.push({ keys: nonEmpty(csv(key)) })
        if (file !== undefined) sources.push({ file, via: "--api-key-file" })
      })
      return sources
    }
    case "vllm": {
      const given = valuesOf(words, "--api-key", true)
      return [{ keys: nonEmpty(given.length > 0 ? given : [env.VLLM_API_KEY ?? ""]) }]
    }
    case "sglang":
      return [{ keys: nonEmpty(valuesOf(words, "--api-key").slice(-1)) }]
    case "mlx":
      return []
  }
}

/** The flags a flavor's engine does not know whatever its version: refused even without --sim-strict-args. */
export const KEYLESS_FLAGS: Record<Flavor, ReadonlySet<string>> = {
  vllm: new Set(),
  sglang: new Set(),
  llama_cpp: new Set(),
  mlx: new Set(["--api-key"])
}

/** llama.cpp's usage block for --api-key-file (common_arg::to_string), printed under its parse error. */
const KEY_FILE_USAGE = [
  "usage:",
  "--api-key-file FNAME                    path to file containing API keys, one per line; lines starting with a",
  "                                        hash are treated as comments (default: none)",
  "                                        (env: LLAMA_ARG_API_KEY_FILE)",
  "",
  "",
  "to show complete usage, run with -h"
]

/**
 * The keys, with each file read: one key a line, `#` lines and empty ones skipped (std::getline: a `\r` stays). A
 * file that cannot be read stops llama-server before it loads anything (common_params_parse: the message on stderr,
 * exit 1), in the words of the flag or the environment variable that named it.
 */
export const loadApiKeys = (
  sources: ReadonlyArray<ApiKeySource>,
  read: (file: string) => string | undefined
): ReadonlyArray<string> | StartDeath => {
  const keys: Array<string> = []
  for (const s of sources) {
    if ("keys" in s) {
      keys.push(...s.keys)
      continue
    }
    const text = read(s.file)
    if (text === undefined) {
      const failed = `error: failed to open file '${s.file}'`
      const lines =
        s.via === "--api-key-file"
          ? [`error while handling argument "--api-key-file": ${failed}`, "", "", ...KEY_FILE_USAGE]
          : [`error while handling environment variable "LLAMA_ARG_API_KEY_FILE": ${failed}`, "", "", ""]
      return { lines: lines.map((text) => ({ stream: "stderr", text })), exit: { code: 1 } }
    }
    const lines = text.split("\n")
    if (text.endsWith("\n")) lines.pop()
    keys.push(...lines.filter((l) => l !== "" && !l.startsWith("#")))
  }
  return keys
}

interface KeyRule {
  /** Whether a request passes without a key. */
  readonly passes: (method: string | undefined, path: string) => boolean
  /** Whether the request's headers carry one of the keys. */
  readonly carries: (headers: http.IncomingHttpHeaders, keys: ReadonlyArray<string>) => boolean
  readonly refusal: unknown
}

/** `Scheme param` with the scheme compared case-insensitively to Bearer and the param exactly to a key. */
const bearer = (value: string | undefined, keys: ReadonlyArray<string>): boolean => {
  const space = value?.indexOf(" ") ?? -1
  if (value === undefined || space < 0) return false
  return value.slice(0, space).toLowerCase() === "bearer" && keys.includes(value.slice(space + 1))
}

const UNAUTHORIZED = { error: "Unauthorized" }

/** A header's value as the frameworks read it: the first one, "" when absent. */
const header = (headers: http.IncomingHttpHeaders, name: string): string => {
  const v = headers[name]
  return (Array.isArray(v) ? v[0] : v) ?? ""
}

/**
 * vLLM's guarded prefixes (vllm/entrypoints/openai/server_utils.py, AuthenticationMiddleware): MIN_GUARDED_PREFIXES
 * and the static prefix of every route the app registers outside PUBLIC_ENDPOINTS (/health, /ping, /load, /version,
 * /metrics, the docs); for a generate model, besides /v1, the tokenizer routes and SageMaker's /invocations. A path is
 * guarded when it merely starts with one (str.startswith), so an unknown path outside them stays a 404.
 */
const VLLM_GUARDED = ["/v1", "/v2", "/inference", "/cohere", "/tokenize", "/detokenize", "/invocations"]

/** llama-server's public paths (tools/server/server-http.cpp, get_public_endpoints): health and the web UI's `/`. */
const LLAMA_PUBLIC = new Set(["/health", "/v1/health", "/"])

const RULES: Record<Flavor, KeyRule | undefined> = {
  // tools/server/server-http.cpp middleware_validate_api_key: Authorization, else X-Api-Key; a leading "Bearer "
  // (as written) is cut; the rest must be one of the keys. OPTIONS never gets here (its pre-routing handler answers it).
  llama_cpp: {
    passes: (_method, path) => LLAMA_PUBLIC.has(path),
    carries: (headers, keys) => {
      const given = header(headers, "authorization") || header(headers, "x-api-key")
      return keys.includes(given.startsWith("Bearer ") ? given.slice(7) : given)
    },
    refusal: { error: { message: "Invalid API Key", type: "authentication_error", code: 401 } }
  },
  vllm: {
    passes: (method, path) => method === "OPTIONS" || !VLLM_GUARDED.some((p) => path.startsWith(p)),
    carries: (headers, keys) => bearer(headers.authorization, keys),
    refusal: UNAUTHORIZED
  },
  // python/sglang/srt/utils/auth.py decide_request_auth (the OpenAI and info routes are AuthLevel.NORMAL, which only
  // --api-key guards; --admin-api-key guards admin routes the simulator does not serve): OPTIONS and /health*,
  // /ready*, /metrics* pass; `Bearer KEY` (scheme in any case) or an `x-api-key: KEY`.
  sglang: {
    passes: (method, path) => method === "OPTIONS" || ["/health", "/ready", "/metrics"].some((p) => path.startsWith(p)),
    carries: (headers, keys) => bearer(headers.authorization, keys) || keys.includes(header(headers, "x-api-key")),
    refusal: UNAUTHORIZED
  },
  mlx: undefined
}

/** The 401 body a request without one of `keys` gets, or undefined when it passes. */
export const keyRefusal = (
  flavor: Flavor,
  keys: ReadonlyArray<string>,
  method: string | undefined,
  path: string,
  headers: http.IncomingHttpHeaders
): unknown => {
  const rule = RULES[flavor]
  if (rule === undefined || keys.length === 0 || rule.passes(method, path) || rule.carries(headers, keys))
    return undefined
  return rule.refusal
}
