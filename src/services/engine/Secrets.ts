/**
 * Which of the engine's settings are secrets, and their scrubbing from text (pure). One rule serves every output:
 * `render`, the `engine run N: spawning` log (a copy of the plan, layers/engine/backends/redact.ts), and every line
 * the engine prints before the agent logs it or keeps it for /status (`lineRedactor`, built once per run).
 *
 * A name is a secret's when one of its words (split at `_`, `-`, `.`; case ignored) is a usual secret marker:
 * SECRET, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL anywhere in a word (AWS_SECRET_ACCESS_KEY, PGPASSWORD,
 * GOOGLE_APPLICATION_CREDENTIALS), a word ending in TOKEN or APIKEY (HF_TOKEN, HFTOKEN, OPENAI_APIKEY; not
 * TOKENIZERS_PARALLELISM nor MAX_TOKENS), or a word that is KEY(S), CRED(S), AUTH, AUTHORIZATION, OAUTH, SESSION,
 * COOKIE(S), PRIVATE, SIGNATURE or PASS (OPENAI_API_KEY, WANDB_CRED, AWS_SESSION_TOKEN; not KEYBOARD nor AUTHOR).
 */

/** What replaces a secret. */
export const REDACTED = "<redacted>"

const SECRET_WORD =
  /^(?:[A-Z0-9]*(?:SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL)[A-Z0-9]*|[A-Z0-9]*(?:TOKEN|APIKEY)|KEYS?|CREDS?|AUTH|AUTHORIZATION|OAUTH|SESSION|COOKIES?|PRIVATE|SIGNATURE|PASS)$/

const words = (name: string): ReadonlyArray<string> => name.toUpperCase().split(/[^A-Z0-9]+/)

/** Whether an environment variable (or any setting) of this name holds a secret. */
export const isSecretName = (name: string): boolean => words(name).some((w) => SECRET_WORD.test(w))

/**
 * Short flags that take a secret, which the name rule cannot tell: llama.cpp's `-hft` for `--hf-token`
 * (ggml-org/llama.cpp common/arg.cpp, `{"-hft", "--hf-token"}`).
 */
const SECRET_SHORT_FLAGS: ReadonlySet<string> = new Set(["-hft"])

const looksLikeFlag = (arg: string): boolean => /^--?[A-Za-z]/.test(arg)

/**
 * Whether a flag's value is a secret: its last word is a secret marker (`--api-key`, `--hf-token`, `--token`,
 * SGLang's `--admin-api-key`). Only the last word, since a flag names its value by it: vLLM's
 * `--long-prefill-token-threshold` takes a number, `--api-key-file` a path.
 */
export const isSecretFlag = (flag: string): boolean => {
  if (!looksLikeFlag(flag)) return false
  if (SECRET_SHORT_FLAGS.has(flag)) return true
  const w = words(flag)
  return SECRET_WORD.test(w[w.length - 1] ?? "")
}

/**
 * Where argv[i] holds a secret: 0 when all of it does (the value after a secret flag: `--api-key V`), the offset
 * after `=` for `--api-key=V`, undefined when none.
 */
export const secretOffset = (argv: ReadonlyArray<string>, i: number): number | undefined => {
  const arg = argv[i] ?? ""
  const prev = argv[i - 1]
  if (prev !== undefined && !prev.includes("=") && isSecretFlag(prev) && !looksLikeFlag(arg)) return 0
  const eq = arg.indexOf("=")
  return eq > 0 && isSecretFlag(arg.slice(0, eq)) ? eq + 1 : undefined
}

/** The secret values of an engine run: of its secret-named variables and of its secret flags' arguments. */
export const secretValues = (
  env: Readonly<Record<string, string | undefined>>,
  argv: ReadonlyArray<string>
): ReadonlyArray<string> => {
  const out: Array<string> = []
  for (const [name, value] of Object.entries(env)) if (value !== undefined && isSecretName(name)) out.push(value)
  argv.forEach((arg, i) => {
    const at = secretOffset(argv, i)
    if (at !== undefined) out.push(arg.slice(at))
  })
  return out
}

/**
 * Values shorter than this are not scrubbed from engine output: a secret that short is no secret, and blanking
 * it would blank common words and numbers (`true`, `8000`) wherever the engine prints them.
 */
export const MIN_SCRUBBED_LENGTH = 6

/**
 * A function that replaces every occurrence of the given secrets in a line with REDACTED. Built once per run; per
 * line it is one `includes` scan per secret (usually a handful), and a line with none comes back as it is, with
 * nothing allocated. A value of several lines (a PEM key) is scrubbed line by line, since output comes in lines.
 * Longer values first, so one that contains another is replaced whole.
 */
export const lineRedactor = (secrets: Iterable<string>): ((line: string) => string) => {
  const values = new Set<string>()
  for (const s of secrets) {
    for (const part of s.split("\n")) {
      const v = part.endsWith("\r") ? part.slice(0, -1) : part
      if (v.length >= MIN_SCRUBBED_LENGTH) values.add(v)
    }
  }
  const sorted = [...values].sort((a, b) => b.length - a.length)
  if (sorted.length === 0) return (line) => line
  return (line) => {
    let out = line
    for (const v of sorted) if (out.includes(v)) out = out.replaceAll(v, REDACTED)
    return out
  }
}
