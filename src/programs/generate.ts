/**
 * `cgn-agent generate`: a newcomer's first call. Sends one Generate to an agent, streams the text to
 * stdout as it arrives, then one summary line to stderr (tokens, time to first token, tokens/s).
 * A failed call fails with `STATUS: message` (cli.ts prints it and exits non-zero).
 * TLS flags as in loadClientCredentials: --ca alone for server TLS, plus --cert/--key for mTLS.
 */
import { Duration, Effect, Option, Schema } from "effect"
import { Command, Flag } from "effect/cli"
import { ClientError, createChannel, createClient, Metadata } from "nice-grpc"
import {
  AgentDefinition,
  type ChatMessage,
  type GenerateFinal,
  type GenerateRequest
} from "../gen/cgn/agent/v1/agent.ts"
import { loadClientCredentials } from "../layers/tls/clientCredentials.ts"
import { HostPort } from "../services/config/ConfigValues.ts"
import { statusName } from "../services/grpc/GrpcStatus.ts"
import { formatTimeout } from "../services/grpc/Wire.ts"
import { splitHostPort } from "../services/net/HostPort.ts"
import { failureDetails } from "./connectFailure.ts"

/** The call failed with a gRPC status, or the flags do not make a request. */
export class GenerateFailed extends Schema.TaggedError<GenerateFailed>()("GenerateFailed", {
  message: Schema.String,
  status: Schema.optionalKey(Schema.String)
}) {}

/** `ROLE:TEXT` as a chat message. */
export const parseMessage = (s: string): ChatMessage | GenerateFailed => {
  const i = s.indexOf(":")
  if (i <= 0)
    return new GenerateFailed({ message: `--message "${s}": expected ROLE:TEXT, e.g. --message "user:Hello"` })
  return { role: s.slice(0, i), content: s.slice(i + 1) }
}

export interface GenerateFlags {
  readonly prompt: Option.Option<string>
  readonly message: ReadonlyArray<string>
  readonly maxTokens: Option.Option<number>
  readonly stop: ReadonlyArray<string>
  readonly model: string
}

/** The request the flags describe: exactly one of --prompt and --message. */
export const requestFromFlags = (f: GenerateFlags): GenerateRequest | GenerateFailed => {
  const prompt = Option.getOrUndefined(f.prompt)
  if ((prompt === undefined) === (f.message.length === 0))
    return new GenerateFailed({ message: "give either --prompt TEXT or one or more --message ROLE:TEXT" })
  const req: GenerateRequest = { requestId: "", model: f.model, includeUsage: true }
  if (prompt !== undefined) req.prompt = prompt
  else {
    const messages: Array<ChatMessage> = []
    for (const m of f.message) {
      const parsed = parseMessage(m)
      if (parsed instanceof GenerateFailed) return parsed
      messages.push(parsed)
    }
    req.chat = { messages }
  }
  const maxTokens = Option.getOrUndefined(f.maxTokens)
  if (maxTokens !== undefined || f.stop.length > 0)
    req.sampling = maxTokens === undefined ? { stop: [...f.stop] } : { maxTokens, stop: [...f.stop] }
  return req
}

/** `--addr` as given when it is `host:port`; grpc-js would otherwise dial port 80 (or 443) for a bare host. */
export const checkAddr = (addr: string): string | GenerateFailed =>
  !Schema.is(HostPort)(addr)
    ? new GenerateFailed({ message: `--addr "${addr}": expected HOST:PORT, e.g. --addr 127.0.0.1:7071` })
    : Number(splitHostPort(addr).port) === 0
      ? // a port to listen on, never one to dial (the connect failed naming no port at all)
        new GenerateFailed({ message: `--addr "${addr}": port 0 is no port to dial; give the agent's gRPC port` })
      : addr

/**
 * No text came, yet the engine answered (a first token the stop sequence cut away, a token that decodes to nothing):
 * when the agent saw its first token, from its final's timings.
 */
const agentTtft = (final: GenerateFinal | undefined): string => {
  const ms = final?.timings?.timeToFirstTokenMs ?? 0
  return ms > 0 ? ` (no text came; the agent had the engine's first token at ${ms.toFixed(1)} ms)` : ""
}

/**
 * The stderr summary line. Its count is the final's usage (the engine's exact count) where the engine reported one,
 * else the deltas' `tokens`, engine chunks (said so: not an exact count).
 */
export const summaryLine = (s: {
  readonly tokens: number
  readonly ttftMs: number | undefined
  readonly totalMs: number
  readonly final: GenerateFinal | undefined
}): string => {
  const usage = s.final?.usage
  const tokens = usage === undefined ? s.tokens : usage.completionTokens
  const decodeMs = s.totalMs - (s.ttftMs ?? s.totalMs)
  const rate = tokens > 1 && decodeMs > 0 ? ((tokens - 1) * 1000) / decodeMs : 0
  const parts = [
    usage !== undefined
      ? `${tokens} tokens`
      : `${tokens} tokens (engine chunks${s.final === undefined ? "" : ": the engine reported no usage"})`,
    `time to first token ${s.ttftMs === undefined ? `-${agentTtft(s.final)}` : `${s.ttftMs.toFixed(1)} ms`}`,
    `${rate.toFixed(1)} tokens/s`,
    `total ${s.totalMs.toFixed(1)} ms`
  ]
  if (s.final !== undefined) {
    parts.push(`finish ${s.final.finishReason}`)
    if (s.final.stopSequence !== "") parts.push(`at stop ${JSON.stringify(s.final.stopSequence)}`)
    parts.push(`request ${s.final.requestId}`)
  }
  return parts.join(", ")
}

/** The most `--max-tokens` can say: `SamplingParams.max_tokens` is a uint32 (the agent caps it lower, max_tokens_limit). */
const MAX_UINT32 = 4_294_967_295
/**
 * The longest `--timeout`, in seconds: AbortSignal.timeout runs a Node timer, which takes at most 2^31 - 1 ms (a
 * longer one fires after 1 ms, with a TimeoutOverflowWarning: every call would end DEADLINE_EXCEEDED at once).
 */
const MAX_TIMEOUT_S = Math.floor((2 ** 31 - 1) / 1000)

/** An integer flag's range: outside it, a one-line usage error (`Invalid value for flag --x: "v". Expected: ...`). */
const inRange = (min: number, max: number, what: string) =>
  Flag.filter(
    (n: number) => n >= min && n <= max,
    () => `${what} from ${min} to ${max}`
  )

const flags = {
  addr: Flag.String("addr").pipe(
    Flag.withMetavar("HOST:PORT"),
    Flag.withDescription("The agent's gRPC address (default 127.0.0.1:7071)"),
    Flag.withDefault("127.0.0.1:7071")
  ),
  prompt: Flag.String("prompt").pipe(Flag.withDescription("A raw prompt (/v1/completions)"), Flag.optional),
  message: Flag.String("message").pipe(
    Flag.withMetavar("ROLE:TEXT"),
    Flag.withDescription("A chat message, repeatable, oldest first (/v1/chat/completions)"),
    Flag.atLeast(0)
  ),
  maxTokens: Flag.Int("max-tokens").pipe(
    inRange(1, MAX_UINT32, "a number of tokens"),
    Flag.withDescription("Most tokens to generate"),
    Flag.optional
  ),
  stop: Flag.String("stop").pipe(
    Flag.withMetavar("TEXT"),
    Flag.withDescription("A stop sequence, repeatable: generation ends before it"),
    Flag.atLeast(0)
  ),
  model: Flag.String("model").pipe(
    Flag.withDescription("Served model name (default: the node's)"),
    Flag.withDefault("")
  ),
  timeout: Flag.Int("timeout").pipe(
    inRange(1, MAX_TIMEOUT_S, "a whole number of seconds"),
    Flag.withDescription("Deadline in seconds (default 300)"),
    Flag.withDefault(300)
  ),
  ca: Flag.String("ca").pipe(Flag.withMetavar("FILE"), Flag.withDescription("CA certificate (TLS)"), Flag.optional),
  cert: Flag.String("cert").pipe(
    Flag.withMetavar("FILE"),
    Flag.withDescription("Client certificate (mTLS)"),
    Flag.optional
  ),
  key: Flag.String("key").pipe(Flag.withMetavar("FILE"), Flag.withDescription("Client key (mTLS)"), Flag.optional),
  serverName: Flag.String("server-name").pipe(
    Flag.withMetavar("NAME"),
    Flag.withDescription("TLS: check the agent's certificate for NAME, not the address dialled (grpcurl -servername)"),
    Flag.optional
  )
}

/**
 * The channel's options: with a server name, grpc-js checks the agent's certificate for it and sends it as the TLS
 * server name (grpc.ssl_target_name_override, @grpc/grpc-js src/channel-credentials.ts): a node whose certificate
 * names it by a DNS SAN, dialled by its IP address (the README's advice for routers), and no IP address set as the
 * server name (Node warns DEP0123 of that, RFC 6066 3).
 */
const channelOptions = (serverName: string | undefined) =>
  serverName === undefined ? {} : { "grpc.ssl_target_name_override": serverName }

type Flags = { readonly [K in keyof typeof flags]: (typeof flags)[K] extends Flag.Flag<infer A> ? A : never }

export const runGenerate = Effect.fn("generate")(function* (f: Flags) {
  const addr = checkAddr(f.addr)
  if (addr instanceof GenerateFailed) return yield* addr
  const req = requestFromFlags(f)
  if (req instanceof GenerateFailed) return yield* req
  const serverName = Option.getOrUndefined(f.serverName)
  if (serverName === "")
    return yield* new GenerateFailed({ message: "--server-name: expected the name the agent's certificate holds" })
  if (serverName !== undefined && Option.isNone(f.ca))
    return yield* new GenerateFailed({ message: "--server-name is a TLS check: give --ca too" })
  const tls = { ca: Option.isSome(f.ca), cert: Option.isSome(f.cert) }
  const credentials = yield* loadClientCredentials(
    {
      caFile: Option.getOrUndefined(f.ca),
      certFile: Option.getOrUndefined(f.cert),
      keyFile: Option.getOrUndefined(f.key)
    },
    { ca: "--ca", cert: "--cert", key: "--key" }
  ).pipe(Effect.mapError((e) => new GenerateFailed({ message: e.message })))
  const channel = yield* Effect.acquireRelease(
    Effect.sync(() => createChannel(addr, credentials, channelOptions(serverName))),
    (ch) => Effect.sync(() => ch.close())
  )
  const client = createClient(AgentDefinition, channel)
  const timeoutMs = Duration.toMillis(Duration.seconds(f.timeout))
  const expired = AbortSignal.timeout(timeoutMs)
  const started = performance.now()
  let ttftMs: number | undefined
  let tokens = 0
  let final: GenerateFinal | undefined
  // stdout's reader gone (`generate ... | head`): each write then fails (EPIPE, Node ignores SIGPIPE), raised as an
  // 'error' on stdout that nobody heard, which ended the CLI with a stack trace. Now the call is cancelled (the agent
  // stops the engine's work) and the CLI ends quietly, as `head` asked. The listener stays: a write already made can
  // still fail later.
  const outputGone = new AbortController()
  process.stdout.on("error", (e) => outputGone.abort(e))
  const line = () => summaryLine({ tokens, ttftMs, totalMs: performance.now() - started, final })
  // The streamed text's line is ended, also when the call fails half-way, so the shell prompt starts on its own line.
  const endTextLine = () => {
    if (ttftMs !== undefined && !outputGone.signal.aborted) process.stdout.write("\n")
  }
  const summary = yield* Effect.tryPromise({
    try: async (signal) => {
      // nice-grpc takes no deadline (grpc-js's is a call option it does not pass on), so the deadline goes as the
      // header grpc-js would write: the agent then sheds a call it cannot answer in time and counts the expiry as
      // DEADLINE_EXCEEDED (the reset this signal sends at that moment reads so there, http2/Call.ts resetWhy).
      const callSignal = AbortSignal.any([signal, expired, outputGone.signal])
      const metadata = Metadata({ "grpc-timeout": formatTimeout(timeoutMs) })
      try {
        for await (const r of client.generate(req, { signal: callSignal, metadata })) {
          if (r.delta !== undefined) {
            if (ttftMs === undefined) ttftMs = performance.now() - started
            tokens += r.delta.tokens
            process.stdout.write(r.delta.text)
          } else if (r.final !== undefined) final = r.final
        }
      } catch (e) {
        if (outputGone.signal.aborted) return `${line()} (stdout closed by its reader: call cancelled)`
        throw e
      } finally {
        if (!signal.aborted) endTextLine()
      }
      return line()
    },
    catch: (e) => {
      if (e instanceof ClientError)
        return new GenerateFailed({
          message: `${statusName(e.code)}: ${failureDetails(e.details, addr, tls)}`,
          status: statusName(e.code)
        })
      if (expired.aborted)
        return new GenerateFailed({
          message: `DEADLINE_EXCEEDED: no complete answer within ${f.timeout}s (--timeout)`,
          status: "DEADLINE_EXCEEDED"
        })
      return new GenerateFailed({ message: e instanceof Error ? e.message : String(e) })
    }
  }).pipe(
    // Ctrl-C (SIGINT) or SIGTERM interrupt the call (the agent counts it CANCELLED) and the process exits 130 before
    // the call's own ending runs: the text's line and the summary are written here, or the prompt went on the text.
    Effect.onInterrupt(() =>
      Effect.sync(() => {
        endTextLine()
        process.stderr.write(`${line()} (interrupted: call cancelled)\n`)
      })
    )
  )
  process.stderr.write(`${summary}\n`)
}, Effect.scoped)

export const generate = Command.make("generate", flags, runGenerate).pipe(
  Command.withDescription("Send one Generate to an agent and stream the answer to stdout (summary on stderr)"),
  Command.withExamples([
    { command: 'cgn-agent generate --addr 127.0.0.1:7071 --prompt "Hello"', description: "A raw prompt" },
    {
      command: 'cgn-agent generate --message "system:Be brief" --message "user:Why is the sky blue?" --max-tokens 64',
      description: "A chat"
    }
  ])
)
