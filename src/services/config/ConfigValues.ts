/**
 * The config's value types (pure): durations written as `5s`, `host:port`, URLs, etcd key parts, ZMQ endpoints.
 * Each refuses a bad value with a message that says what was expected; the sections are ConfigSchema.ts.
 */
import { Duration, Effect, Option, Schema, SchemaIssue, SchemaTransformation } from "effect"
import { redactUrlCredentials } from "../engine/Secrets.ts"
import { isWildcardHost, splitHostPort } from "../net/HostPort.ts"

const UNIT: Record<string, Duration.Unit> = { ms: "millis", s: "seconds", m: "minutes", h: "hours", d: "days" }

/** A duration's form: a number and a unit. */
const DURATION_FORM = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/

/** Parses `500ms`, `5s`, `2m`, `1h`, `1d` (blanks around the number and between it and the unit are allowed). */
export const parseShortDuration = (text: string): Option.Option<Duration.Duration> => {
  const m = DURATION_FORM.exec(text.trim())
  if (!m) return Option.none()
  // Millisecond resolution: "0.0000001s" would otherwise reach Duration as "1e-7 seconds" and throw;
  // a positive duration under 1ms (or one too large to count) is refused rather than rounded to 0.
  const exact = Number(m[1]) * Duration.toMillis(Duration.fromInputUnsafe(`1 ${UNIT[m[2]!]!}`))
  const ms = Math.round(exact)
  if (!Number.isSafeInteger(ms) || (ms === 0 && exact > 0)) return Option.none()
  return Option.some(Duration.millis(ms))
}

/** Formats a duration the way the config file writes it (`1500ms`, `5s`, `2m`). */
export const formatShortDuration = (d: Duration.Duration): string => {
  const ms = Duration.toMillis(d)
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`
  if (ms % 1000 === 0) return `${ms / 1000}s`
  return `${ms}ms`
}

/** What every duration key expects; SchemaProblems.ts says it too of a duration written as a number (`heartbeat = 5`). */
export const DURATION_EXPECTED = `expected a duration such as "500ms", "5s", "2m" or "1h"`

/** Why parseShortDuration read no duration in `s`: a duration's form whose value it cannot count, or no duration. */
const unreadDuration = (s: string): string => {
  const m = DURATION_FORM.exec(s.trim())
  if (m === null) return `${DURATION_EXPECTED}, got "${s}"`
  return Number(m[1]) > 0 && Number(m[1]) * Duration.toMillis(Duration.fromInputUnsafe(`1 ${UNIT[m[2]!]!}`)) < 1
    ? `expected a duration of at least 1ms (or 0), got "${s}"`
    : `expected a duration the agent can count in milliseconds (at most 104249991d), got "${s}"`
}

/**
 * A duration written as a string such as `5s`. With `zeroMeans`, a zero duration is refused, and the message
 * says what 0 would do (a timer that fires at once, every time).
 */
const durationString = (zeroMeans?: string, floor?: { readonly ms: number; readonly why: string }) =>
  Schema.String.pipe(
    Schema.decodeTo(
      Schema.Duration,
      SchemaTransformation.transformEffect({
        decode: (s: string) =>
          Option.match(parseShortDuration(s), {
            onNone: () => Effect.fail(new SchemaIssue.InvalidValue({ message: unreadDuration(s) }, s)),
            onSome: (d) =>
              zeroMeans !== undefined && Duration.toMillis(d) === 0
                ? Effect.fail(
                    new SchemaIssue.InvalidValue(
                      { message: `expected a duration above 0 such as "5s", got "${s}": ${zeroMeans}` },
                      s
                    )
                  )
                : floor !== undefined && Duration.toMillis(d) > 0 && Duration.toMillis(d) < floor.ms
                  ? Effect.fail(
                      new SchemaIssue.InvalidValue(
                        {
                          message: `expected "0s" or a duration of at least ${formatShortDuration(Duration.millis(floor.ms))}, got "${s}": ${floor.why}`
                        },
                        s
                      )
                    )
                  : Effect.succeed(d)
          }),
        encode: (d: Duration.Duration) => Effect.succeed(formatShortDuration(d))
      })
    )
  )

/** A duration written as a string such as `5s`. */
export const ShortDuration = durationString()

/** A duration above 0: `zeroMeans` says what 0 would do instead. */
export const PositiveDuration = (zeroMeans: string) => durationString(zeroMeans)

/** "0s" (off), or a duration of at least `minMs`: `why` says what a shorter one would do. */
export const OffOrAtLeast = (minMs: number, why: string) => durationString(undefined, { ms: minMs, why })

const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/

/** Why the host of a `host:port` names no address (brackets hold an IPv6 address, four numbers an IPv4 one), or undefined. */
const hostProblem = (host: string): string | undefined => {
  // WHATWG URL parsing (a global, no I/O) checks both forms: "[1.2.3.4]" and "999.0.0.1" are no hosts to it.
  if (host.startsWith("[") && (!host.includes(":") || !URL.canParse(`http://${host}/`)))
    return `${host} is not an IPv6 address (brackets are for IPv6 only)`
  if (/^\d+\.\d+\.\d+\.\d+$/.test(host) && !URL.canParse(`http://${host}/`)) return `${host} is not an IPv4 address`
  return undefined
}

/** `host:port` (IPv6 in brackets); port 0 lets the OS choose, which tests use. */
export const HostPort = Schema.String.check(
  Schema.makeFilter((s) => {
    const m = HOST_PORT.exec(s)
    const expected = `expected host:port such as "0.0.0.0:7071", got "${s}"`
    if (!m) return expected
    if (Number(m[2]) > 65535) return `${expected}: the port is at most 65535`
    const why = hostProblem(m[1]!)
    return why === undefined ? undefined : `${expected}: ${why}`
  })
)

/** `advertise_addr`: a `host:port` the router can dial, so neither a wildcard host nor port 0. */
export const DialableHostPort = HostPort.check(
  Schema.makeFilter((s) => {
    if (!HOST_PORT.test(s)) return undefined // HostPort says what is wrong
    const { host, port } = splitHostPort(s)
    if (isWildcardHost(host))
      return `expected an address the router can dial, got "${s}": ${host} is every address of this host, not one; give this host's IP or DNS name`
    if (Number(port) === 0)
      return `expected an address the router can dial, got "${s}": port 0 is no port to dial; give listen_grpc's port, or leave advertise_addr unset to publish the port listen_grpc binds`
    return undefined
  })
)

/** An absolute http(s) URL. */
export const HttpUrl = Schema.String.check(
  Schema.makeFilter((s) => {
    try {
      const u = new URL(s)
      if (u.protocol === "http:" || u.protocol === "https:") return undefined
    } catch {
      // fall through to the message
    }
    // the URL parser refuses a port past 65535 as it refuses any malformed URL: say which part is wrong
    const port = /^https?:\/\/[^/?#\s]*:(\d+)(?:[/?#]|$)/i.exec(s)?.[1]
    const why = port !== undefined && Number(port) > 65_535 ? `: port ${port} is past 65535` : ""
    return `expected an http:// or https:// URL, got "${redactUrlCredentials(s)}"${why}`
  })
)

/** An http(s) URL without `user:password@`; `where` says where the credentials go instead. */
export const HttpUrlWithoutCredentials = (where: string) =>
  HttpUrl.check(
    Schema.makeFilter((s) => {
      try {
        const u = new URL(s)
        if (u.username !== "" || u.password !== "") return `credentials do not belong in the URL; ${where}`
      } catch {
        // HttpUrl says what is wrong
      }
      return undefined
    })
  )

/**
 * A `cluster.etcd` endpoint: `http(s)://host:port` and nothing after the port. The etcd3 client strips the
 * scheme and hands the rest to grpc-js as its target as written (etcd3 lib/connection-pool.js removeProtocolPrefix),
 * which reads a path, a "/" alone, a query or a fragment as part of the port, and no call ever connects.
 * The port is required: without one grpc-js dials 443 (grpc-js src/resolver-dns.ts DEFAULT_PORT) whatever the
 * scheme said, and the node retries registering forever against a port its config never named.
 */
export const EtcdEndpoint = HttpUrlWithoutCredentials(
  "set cluster.etcd_username and cluster.etcd_password instead"
).check(
  Schema.makeFilter((s) => {
    if (!/^https?:$/.test(URL.parse(s)?.protocol ?? "")) return undefined // HttpUrl says what is wrong
    const authority = /^https?:\/\/([^/?#\s]+)$/.exec(s)?.[1]
    if (authority === undefined)
      return `expected an etcd endpoint such as "https://10.0.0.5:2379": scheme, host and port, nothing after the port (the etcd client dials what follows the scheme as written), got "${redactUrlCredentials(s)}"`
    // Checked on the text, not URL.port: the URL parser drops a scheme's default port ("https://h:443" has port "").
    // An IPv6 host ends with "]", so "[::1]" has no port and "[::1]:2379" has one.
    const port = /:(\d+)$/.exec(authority)?.[1]
    if (port === undefined)
      return `expected an etcd endpoint with a port, got "${redactUrlCredentials(s)}", which has no port (the etcd client would dial 443): write it, e.g. "${redactUrlCredentials(s).replace(/:$/, "")}:2379" (etcd's client port is 2379)`
    if (Number(port) === 0)
      return `expected an etcd endpoint with a port to dial, got "${redactUrlCredentials(s)}": port 0 is none`
    return undefined
  })
)

/** Characters an etcd key part may not hold: "/" would move the key to another place, control characters break it. */
const KEY_PART_FORBIDDEN = /[/\p{Cc}]/u

/**
 * Why `s` cannot be one part of the node's etcd key `<etcd_prefix>/<cluster.name>/nodes/<node_id>`, or undefined.
 * Exported for node_id taken from NODE_NAME or the hostname, which the schema never sees.
 */
export const keyPartProblem = (s: string): string | undefined =>
  KEY_PART_FORBIDDEN.test(s)
    ? `expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got ${JSON.stringify(s)}`
    : undefined

export const KeyPart = Schema.NonEmptyString.check(Schema.makeFilter(keyPartProblem))

/** `cluster.etcd_prefix`: "/a" or "/a/b", so `<prefix>/<name>/nodes/` is one well-formed key range of its own. */
export const EtcdPrefix = Schema.String.check(
  Schema.makeFilter((s) => {
    const got = `got ${JSON.stringify(s)}`
    if (!s.startsWith("/")) return `expected a key prefix starting with "/", such as "/cgn", ${got}`
    if (/^\/+$/.test(s))
      return `expected a key prefix such as "/cgn", ${got}: it would put the node keys at the root of etcd (/<name>/nodes/...), among other applications' keys`
    if (s.endsWith("/"))
      return `expected no "/" at the end (keys are <etcd_prefix>/<name>/nodes/<node_id>), ${got}; write ${JSON.stringify(s.replace(/\/+$/, ""))}`
    if (s.includes("//")) return `expected no empty part ("//"), ${got}`
    if (/\p{Cc}/u.test(s)) return `expected no control characters, ${got}`
    return undefined
  })
)

/**
 * A ZMQ endpoint of the engine's KV events: `tcp://HOST:PORT` (the port is offset by the DP rank),
 * `ipc://PATH` or `inproc://NAME`; anything else would only fail once the KV bridge opens its socket.
 */
export const ZmqEndpoint = Schema.String.check(
  Schema.makeFilter((s) => {
    const expected = `expected a ZMQ endpoint such as "tcp://127.0.0.1:5557", "tcp://*:5557" or "ipc:///run/kv.sock", got ${JSON.stringify(s)}`
    const tcp = /^tcp:\/\/(\S+):(\d+)$/.exec(s)
    if (tcp !== null) {
      // A fixed port both sides know: libzmq takes 0 (or *) as "any free port", which the other side cannot find.
      const port = Number(tcp[2])
      if (port > 65535) return `${expected}: the port is at most 65535`
      if (port === 0) return `${expected}: port 0 is no port the other side can find; give a fixed port`
      // `*`, an IPv4 address, an IPv6 one in brackets, or a name (DNS, or an interface such as eth0 to bind);
      // anything else ("a:b") names no host, and the side that binds it retries forever.
      const host = tcp[1]!
      if (host !== "*" && !HOST_PORT.test(`${host}:${port}`))
        return `${expected}: ${host} is no host (an IPv6 address goes in brackets: "tcp://[::1]:5557")`
      const why = hostProblem(host)
      return why === undefined ? undefined : `${expected}: ${why}`
    }
    return /^(ipc|inproc):\/\/\S+$/.test(s) ? undefined : expected
  })
)
