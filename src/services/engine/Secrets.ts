/**
 * Which of the engine's settings are secrets, and their places in a text (pure). One rule serves every output:
 * `render`, the `engine run N: spawning` log (a copy of the plan, layers/engine/backends/redact.ts), every line
 * the engine prints before the agent logs it or keeps it for /status, and the engine's words in every error of its
 * answers the agent passes on (LineRedactor.ts, from `secretValues`; services/engine/EngineErrors.ts).
 *
 * A name is a secret's when one of its words (split at `_`, `-`, `.`; case ignored) is a usual secret marker:
 * SECRET, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL anywhere in a word (AWS_SECRET_ACCESS_KEY, PGPASSWORD,
 * GOOGLE_APPLICATION_CREDENTIALS), a word ending in TOKEN or APIKEY (HF_TOKEN, HFTOKEN, OPENAI_APIKEY; not
 * TOKENIZERS_PARALLELISM nor MAX_TOKENS), or a word that is KEY(S), CRED(S), AUTH, AUTHORIZATION, OAUTH, SESSION,
 * COOKIE(S), PRIVATE, SIGNATURE or PASS (OPENAI_API_KEY, WANDB_CRED, AWS_SESSION_TOKEN; not KEYBOARD nor AUTHOR).
 * Other names' values are shown, since the spawn line and `render` are there to show what runs, but for the parts
 * that are credentials whatever the name: the values of a header list (OTEL_EXPORTER_OTLP_HEADERS) and the password
 * of a URL (`HTTPS_PROXY=http://user:PASSWORD@proxy`), in variables and arguments alike.
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

/**
 * Whether a variable (or a flag's value) holds a list of HTTP headers, `key=value,key2=value2`, whose values are
 * secrets whatever the keys: its last word is HEADERS. OpenTelemetry's OTEL_EXPORTER_OTLP_HEADERS and its per-signal
 * OTEL_EXPORTER_OTLP_{TRACES,METRICS,LOGS}_HEADERS carry a collector's credentials (`authorization=Bearer ...`;
 * opentelemetry-specification, specification/protocol/exporter.md, "Specifying headers via environment variables").
 */
export const isHeaderListName = (name: string): boolean => {
  const w = words(name)
  return w[w.length - 1] === "HEADERS"
}

/** A secret's place in a text: [start, end). */
export type Span = readonly [number, number]

const trimmed = (text: string, start: number, end: number): ReadonlyArray<Span> => {
  let s = start
  let e = end
  while (s < e && /\s/.test(text.charAt(s))) s++
  while (e > s && /\s/.test(text.charAt(e - 1))) e--
  return e > s ? [[s, e]] : []
}

/** A header list's values (after each entry's first `=`); an entry without `=`, whole. */
const headerListSpans = (text: string): ReadonlyArray<Span> => {
  const out: Array<Span> = []
  let at = 0
  for (const entry of text.split(",")) {
    const eq = entry.indexOf("=")
    out.push(...trimmed(text, at + eq + 1, at + entry.length))
    at += entry.length + 1
  }
  return out
}

/**
 * The shortest userinfo without a password taken as a credential: tokens written so are long (GitHub's 40, GitLab's
 * 26, Hugging Face's 37 characters), user names short; shorter ones (`pytorch`) would be blanked in every line.
 */
const MIN_BARE_TOKEN = 16

/** A URL scheme's characters after its first letter (RFC 3986 3.1). */
const SCHEME_CHAR = /[A-Za-z0-9+.-]/
/** What ends a URL's authority (RFC 3986 3.2): the path, query or fragment, or the text's next word. */
const AUTHORITY_END = /[\s/?#]/

/**
 * The credentials of the URLs in a text (a proxy's `http://user:PASSWORD@proxy:3128`, a database URL): the password,
 * or the whole userinfo when it has none (`https://TOKEN@host`, as git credentials are often written). The userinfo
 * runs up to the last `@` before the host, since a password's `@` is often left unencoded. Found from each `://`, one
 * pass over the text: a RegExp that tried a scheme at every letter took time quadratic in a long word (an engine
 * argument of 200k letters blocked the agent for about a minute).
 */
const urlSpans = (text: string): ReadonlyArray<Span> => {
  const out: Array<Span> = []
  for (let sep = text.indexOf("://"); sep >= 0; sep = text.indexOf("://", sep + 3)) {
    let scheme = sep
    while (scheme > 0 && SCHEME_CHAR.test(text.charAt(scheme - 1))) scheme--
    // a scheme starts with a letter: skip what precedes the first one of the run
    while (scheme < sep && !/[A-Za-z]/.test(text.charAt(scheme))) scheme++
    if (scheme === sep) continue
    const start = sep + 3
    let end = start
    while (end < text.length && !AUTHORITY_END.test(text.charAt(end))) end++
    const inAuthority = text.slice(start, end).lastIndexOf("@")
    if (inAuthority <= 0) continue // no userinfo, or an empty one
    const at = start + inAuthority
    const colon = text.indexOf(":", start)
    if (colon >= 0 && colon < at) out.push(...trimmed(text, colon + 1, at))
    // userinfo without a password: a token (`https://ghp_...@github.com`), not a user name (`https://git@host`)
    else if (at - start >= MIN_BARE_TOKEN) out.push([start, at])
  }
  return out
}

/** Where an environment variable's value holds secrets. */
const envSpans = (name: string, value: string): ReadonlyArray<Span> =>
  isSecretName(name)
    ? trimmed(value, 0, value.length)
    : [...(isHeaderListName(name) ? headerListSpans(value) : []), ...urlSpans(value)]

/**
 * Where argv[i] is a header list, the offset it starts at: the value after a flag whose last word is HEADERS
 * (`--otlp-headers V`, `--otlp-headers=V`), as a variable of such a name is one.
 */
const headerListOffset = (argv: ReadonlyArray<string>, i: number): number | undefined => {
  const arg = argv[i] ?? ""
  const prev = argv[i - 1]
  if (prev !== undefined && !prev.includes("=") && looksLikeFlag(prev) && isHeaderListName(prev) && !looksLikeFlag(arg))
    return 0
  const eq = arg.indexOf("=")
  return eq > 0 && looksLikeFlag(arg) && isHeaderListName(arg.slice(0, eq)) ? eq + 1 : undefined
}

/** Where argv[i] holds secrets. */
const argSpans = (argv: ReadonlyArray<string>, i: number): ReadonlyArray<Span> => {
  const arg = argv[i] ?? ""
  const at = secretOffset(argv, i)
  if (at !== undefined) return trimmed(arg, at, arg.length)
  const list = headerListOffset(argv, i)
  const listSpans =
    list === undefined ? [] : headerListSpans(arg.slice(list)).map(([s, e]): Span => [s + list, e + list])
  return [...listSpans, ...urlSpans(arg)]
}

/** The text with each span replaced by REDACTED (overlapping spans as one). */
const redactSpans = (text: string, spans: ReadonlyArray<Span>): string => {
  if (spans.length === 0) return text
  const sorted = [...spans].sort((a, b) => a[0] - b[0])
  let out = ""
  let at = 0
  for (const [s, e] of sorted) {
    if (e <= at) continue
    if (s >= at) out += `${text.slice(at, s)}${REDACTED}`
    at = e
  }
  return out + text.slice(at)
}

/** A text with its URLs' credentials replaced (see urlSpans): config messages use the rule engine output does. */
export const redactUrlCredentials = (text: string): string => redactSpans(text, urlSpans(text))

/** A variable's value as it may be shown: a header list's keys and a URL's user and host stay. */
export const redactEnvValue = (name: string, value: string): string => redactSpans(value, envSpans(name, value))

/** argv[i] as it may be shown: `--api-key=<redacted>`, a URL's user and host stay. */
export const redactArg = (argv: ReadonlyArray<string>, i: number): string =>
  redactSpans(argv[i] ?? "", argSpans(argv, i))

/**
 * A credential after an HTTP auth scheme (`Bearer TOKEN`, `Basic B64`), printed alone as often as whole. Known
 * schemes only: any first word would make the second of a two-word secret ("password incorrect") one on its own.
 */
const AUTH_SCHEME = /^(?:Bearer|Basic|Token|Digest|ApiKey|Api-Key)[ \t]+(\S+)$/i

/** A secret as it is, percent-decoded (a header list's and a URL's values are percent-encoded), its credential. */
const secretParts = (secret: string): ReadonlyArray<string> => {
  let decoded = secret
  try {
    decoded = decodeURIComponent(secret)
  } catch {
    // not percent-encoded
  }
  return [...new Set([secret, decoded])].flatMap((s) => {
    const credential = AUTH_SCHEME.exec(s)?.[1]
    return credential === undefined ? [s] : [s, credential]
  })
}

/**
 * The secret values of an engine run: of its secret-named variables, the values of its header lists, the passwords
 * of the URLs in its variables and arguments, its secret flags' arguments; and `authorization`, the header the agent
 * sends the engine (LaunchPlan.authorization, `Bearer <engine.api_key>`) with its credential, which an engine the
 * agent does not spawn (openai_compat) has in neither.
 */
export const secretValues = (
  env: Readonly<Record<string, string | undefined>>,
  argv: ReadonlyArray<string>,
  authorization?: string
): ReadonlyArray<string> => {
  const out: Array<string> = []
  const take = (text: string, spans: ReadonlyArray<Span>) => {
    for (const [s, e] of spans) out.push(...secretParts(text.slice(s, e)))
  }
  for (const [name, value] of Object.entries(env)) if (value !== undefined) take(value, envSpans(name, value))
  for (let i = 0; i < argv.length; i++) take(argv[i] ?? "", argSpans(argv, i))
  if (authorization !== undefined) take(authorization, trimmed(authorization, 0, authorization.length))
  return out
}
