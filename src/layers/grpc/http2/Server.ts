/**
 * The agent's gRPC server: gRPC over node:http2 (grpc/grpc doc/PROTOCOL-HTTP2.md), serving services given
 * as grpc-js ServiceDefinitions through `addService`, the method grpc-health-check and @grpc/reflection add
 * themselves with. Served here rather than by grpc-js's Server for two measured reasons (docs/bench.md):
 * the per-call and per-token CPU of the relay (grpc-js's server stack was most of what the agent adds), and
 * HTTP/2 settings grpc-js does not expose: Node's rapid-reset guard (streamResetBurst/Rate) cut a router's
 * burst of cancels short with INTERNAL.
 * The request's framing and decoding, deadlines (the caller's, and the request's arrival) and the listener's
 * lifecycle live here; its options in ServerOptions.ts; one call's responses in Call.ts; the routes and the
 * hand-over to handlers in routes.ts; the connections (handshake deadline, what close() closes at once) in
 * Connections.ts; the caps on connections and the flood rule in Guard.ts; `security.allowed_client_names` in
 * clientNames.ts.
 */

import * as http2 from "node:http2"
import type * as net from "node:net"
import type * as grpc from "@grpc/grpc-js"
import { chunkBytes, unreadCredit } from "../../../services/grpc/FloodRule.ts"
import { type GrpcFailure, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import {
  CallCancelled,
  CallDeadlineExceeded,
  invalidTimeout,
  MessageTooLarge,
  ProtocolViolation,
  RequestReadTimeout,
  RequestsOverBudget,
  type TransportError,
  UnknownMethod
} from "../../../services/grpc/TransportErrors.ts"
import { isGrpcContentType, MessageReader, parseTimeout } from "../../../services/grpc/Wire.ts"
import { ServerCall } from "./Call.ts"
import { Connections, HANDSHAKE_TIMEOUT_MS, type OpenConnections, sessionSettings } from "./Connections.ts"
import { followClientNames, type RefusalOf } from "./clientNames.ts"
import { type Decoder, decode } from "./decodeMessage.ts"
import { Guard } from "./Guard.ts"
import { MAX_TIMER_MS, messageBound, messageTimeout, RESET_AFTER_END_MS } from "./messageBound.ts"
import { type Route, routesOf, runRoute } from "./routes.ts"
import type { Http2GrpcServerOptions } from "./ServerOptions.ts"

export type { Http2GrpcServerOptions } from "./ServerOptions.ts"

const failure = (e: TransportError): GrpcFailure => toGrpcFailure(e)
const noBody = (): Buffer => Buffer.alloc(0)
const noop = (): void => {}

/** Answers a request that is no gRPC call (not POST, not application/grpc) with a bare HTTP status. */
const refuse = (stream: http2.ServerHttp2Stream, status: number): void => {
  // The caller may still reset the stream, with an error code Node raises as the stream's 'error': one
  // nobody listens to would end the daemon (ServerCall listens on the streams it serves).
  stream.on("error", noop)
  stream.respond({ ":status": status }, { endStream: true })
}

/** The status of a call its caller cancelled, from the status table (never sent: what onRejected is told). */
const CANCELLED = failure(new CallCancelled())
/** The end of a call whose grpc-timeout passed (made once: an error built per call costs every call). */
const DEADLINE = failure(new CallDeadlineExceeded())

export class Http2GrpcServer {
  readonly #routes = new Map<string, Route>()
  readonly #options: Http2GrpcServerOptions
  readonly #connections: Connections
  readonly #guard: Guard
  #server: http2.Http2Server | http2.Http2SecureServer | undefined
  /** Bytes received on streams whose handler has not run yet (maxArrivingBytes). */
  #arriving = 0
  #unsubscribe: (() => void) | undefined
  /** security.allowed_client_names: the refusal of a call's connection (clientNames.ts); absent without a list. */
  #refusalOf: RefusalOf | undefined
  /** The end of a request that did not arrive in time (made once, as DEADLINE). */
  readonly #readTimeout: GrpcFailure
  /** requestReadTimeoutMs's end of a request-streaming call, one of whose messages did not arrive in time. */
  readonly #messageTimeout: GrpcFailure

  constructor(options: Http2GrpcServerOptions) {
    this.#options = options
    this.#readTimeout = failure(new RequestReadTimeout({ timeoutMs: options.requestReadTimeoutMs ?? 0 }))
    this.#messageTimeout = messageTimeout(this.#readTimeout, options.requestReadTimeoutMs ?? 0)
    this.#guard = new Guard(options)
    this.#connections = new Connections(options)
  }

  /** Adds a service's methods (grpc-js's `Server.addService` shape). */
  addService(service: grpc.ServiceDefinition, implementation: grpc.UntypedServiceImplementation): void {
    for (const route of routesOf(service, implementation)) this.#routes.set(route.definition.path, route)
  }

  /** Listens on `host`:`port`; resolves with the bound port (the real one for port 0). */
  listen(host: string, port: number): Promise<number> {
    const settings = sessionSettings(this.#options.maxConcurrentStreams, this.#options.streamResets)
    const tls = this.#options.tls
    const server =
      tls === undefined
        ? http2.createServer(settings)
        : http2.createSecureServer({
            ...settings,
            ...tls.current(),
            requestCert: true,
            rejectUnauthorized: true,
            ALPNProtocols: ["h2"],
            // Past it node:tls destroys the socket and emits 'tlsClientError' ERR_TLS_HANDSHAKE_TIMEOUT (logged).
            handshakeTimeout: this.#options.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS
          })
    if (tls !== undefined) {
      const secure = server as http2.Http2SecureServer
      this.#unsubscribe = tls.subscribe((m) => secure.setSecureContext({ ca: m.ca, cert: m.cert, key: m.key }))
    }
    this.#server = server
    this.#connections.attach(server)
    // Last: it wraps every 'connection' listener added before it (Guard.ts).
    this.#guard.attach(server)
    if (tls?.clientNames !== undefined)
      this.#refusalOf = followClientNames(server as http2.Http2SecureServer, tls.clientNames)
    server.on("stream", (stream, headers) => this.#onStream(stream, headers))
    return new Promise((resolve, reject) => {
      // Not listening: nothing will close this server, so its certificate subscription and the guard's sampling
      // timer end here.
      const failed = (e: Error): void => {
        this.#unsubscribe?.()
        this.#guard.stop()
        reject(e)
      }
      server.once("error", failed)
      server.listen({ host, port }, () => {
        server.off("error", failed)
        server.on("error", (e) => this.#options.onError?.(e))
        resolve((server.address() as net.AddressInfo).port)
      })
    })
  }

  /**
   * Stops taking connections and sends GOAWAY on each, so running calls finish and new ones go elsewhere;
   * connections with no call running (or still in their handshake) close at once. Resolves when every
   * connection has closed.
   */
  close(): Promise<void> {
    const server = this.#server
    this.#unsubscribe?.()
    this.#guard.stop()
    if (server === undefined || !server.listening) return Promise.resolve()
    // First: the server's own close closes every session gracefully, which waits on the client (Connections.ts).
    this.#connections.close()
    return new Promise<void>((resolve) => server.close(() => resolve()))
  }

  /** The connections open now and the calls running on them: what destroy() would cut. */
  get open(): OpenConnections {
    return this.#connections.open
  }

  /** Connections open now, counted from their accept (what maxConnections caps). */
  get connections(): number {
    return this.#guard.open
  }

  /** Closes every connection now: their running calls see 'cancelled'. */
  destroy(): void {
    this.#unsubscribe?.()
    this.#guard.stop()
    this.#connections.destroy()
    if (this.#server?.listening) this.#server.close()
  }

  #onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    const accounting = this.#guard.onStream(stream, headers)
    if (headers[":method"] !== "POST" || !isGrpcContentType(headers["content-type"])) {
      refuse(stream, headers[":method"] !== "POST" ? 405 : 415)
      stream.once("close", () => this.#guard.onStreamClosed(accounting, stream.rstCode))
      this.#guard.onRefused(accounting)
      return
    }
    const path = headers[":path"] ?? ""
    const route = this.#routes.get(path)
    const serialize = route?.definition.responseSerialize ?? noBody
    const call = new ServerCall<unknown, unknown>(stream, headers, serialize, this.#connections.tallyOf(stream.session))
    call.onClosed = (rstCode) => this.#guard.onStreamClosed(accounting, rstCode)
    // Every header and request byte is the call's (Guard.ts's flood rule), a refused call's too, and what the caller
    // may still send when the server stops its request early (a refusal, a message too large, a deadline): at most
    // the stream's window, which no call reads and nghttp2 drops. One 'data' listener per stream (two cost a call).
    let streamBytes = 0
    let onChunk: ((chunk: Buffer) => void) | undefined
    stream.on("data", (chunk: Buffer) => {
      streamBytes += chunk.length
      accounting.accounted += chunkBytes(chunk.length)
      onChunk?.(chunk)
    })
    call.onUnread = (windowLeft) => {
      accounting.accounted += unreadCredit(windowLeft, streamBytes, stream.session?.localSettings.initialWindowSize)
    }
    // Until the handler runs, every end of the call is the server's: reported through onRejected, which says what is
    // sent (ServerOptions.ts). What the request holds of the arriving budget (every byte until then) is given back at
    // the handler or at that end.
    let handled = false
    let held = 0
    // The arrival bound's timer (requestReadTimeoutMs), stopped with the budget: at the handler or the call's end.
    let reading: ReturnType<typeof setTimeout> | undefined
    const release = (): void => {
      clearTimeout(reading)
      this.#arriving -= held
      held = 0
    }
    /** A refusal of the caller's making, before the method runs (Guard.ts bounds them per connection). */
    const refuseCall = (f: GrpcFailure): void => {
      reject(f)
      this.#guard.onRefused(accounting)
    }
    const reject = (f: GrpcFailure): void => {
      if (call.done) return
      release()
      call.sendStatus(this.#options.onRejected?.(path, f) ?? f)
    }
    // Before the method is looked up: a client the list refuses learns nothing of what this server serves.
    const refused = this.#refusalOf?.(stream.session)
    if (refused !== undefined) {
      refuseCall(refused)
      return
    }
    if (route === undefined) {
      refuseCall(failure(new UnknownMethod({ path })))
      return
    }
    const timeout = parseTimeout(headers["grpc-timeout"] as string | undefined)
    if (timeout === "invalid") {
      refuseCall(failure(invalidTimeout(String(headers["grpc-timeout"]))))
      return
    }
    // A grpc-timeout of 0 has passed before the call began (grpc-go's server context is done from the start); left to
    // the timer, a call the engine answered within its first millisecond ended OK after its deadline.
    if (timeout === 0) {
      refuseCall(DEADLINE)
      return
    }
    if (timeout !== undefined) call.endAt(timeout, DEADLINE)
    call.once("cancelled", (why: "cancelled" | "deadline") => {
      if (why === "cancelled") this.#guard.onReset(accounting)
      if (handled) return
      release()
      this.#options.onRejected?.(path, why === "deadline" ? DEADLINE : CANCELLED)
    })
    const decoder: Decoder = {
      path,
      encoding: (headers["grpc-encoding"] as string | undefined) ?? "identity",
      limit: this.#options.maxReceiveMessageLength,
      deserialize: route.definition.requestDeserialize
    }
    // Unzeroed memory (Buffer.allocUnsafe) for a message gathered from several chunks: every byte is written.
    const reader = new MessageReader(decoder.limit, Buffer.allocUnsafe)
    const streaming = route.kind === "bidi" || route.kind === "clientStream"
    // One timer per call, as the deadline's (Node keeps the timers of one duration in one list: O(1) to add and
    // clear), none when the caller's own deadline comes first; past setTimeout's limit (2^31-1 ms, ~24.8 days) Node
    // would fire it at once, so that is never too.
    const readMs = this.#options.requestReadTimeoutMs ?? 0
    if (!streaming && readMs > 0 && readMs <= MAX_TIMER_MS && !(timeout !== undefined && timeout <= readMs))
      reading = setTimeout(reject, readMs, this.#readTimeout)
    let received = 0
    // Each chunk's messages, until the call is over; the first failure ends it.
    const onMessages = (chunk: Buffer): GrpcFailure | undefined => {
      const messages = reader.push(chunk)
      if (!Array.isArray(messages))
        return failure(new MessageTooLarge({ length: messages.length, limit: decoder.limit }))
      for (const m of messages) {
        const decoded = decode(decoder, m)
        if (!decoded.ok) return decoded.failure
        received++
        if (streaming) call.receive(decoded.value)
        else if (received > 1)
          return failure(new ProtocolViolation({ detail: `${path} takes one request message, got more` }))
        else call.request = decoded.value
      }
      return undefined
    }
    // A failure after the handler runs (a second message on a stream it reads) is the handler's call to end.
    const end = (f: GrpcFailure): void => (handled ? call.sendStatus(f) : reject(f))
    const budget = this.#options.maxArrivingBytes ?? Number.POSITIVE_INFINITY
    // A request-streaming call's bound (requestReadTimeoutMs): each message, from its first bytes to its last.
    const bound = streaming ? messageBound(stream, readMs, () => end(this.#messageTimeout)) : undefined
    onChunk = (chunk: Buffer) => {
      if (call.done) return
      if (!handled) {
        if (this.#arriving + chunk.length > budget)
          return reject(failure(new RequestsOverBudget({ limitBytes: budget })))
        held += chunk.length
        this.#arriving += chunk.length
      }
      const f = onMessages(chunk)
      if (f !== undefined) end(f)
      else bound?.after(reader.pending)
    }
    stream.once("end", () => {
      // A caller's reset ends the request too: that is its cancel ('cancelled' on close), not a short message.
      if (call.done || stream.aborted) return
      clearTimeout(reading)
      bound?.stop()
      const broken =
        reader.pending > 0
          ? "the request ended inside a message"
          : !streaming && received === 0
            ? "the request carried no message"
            : undefined
      // Answered once a reset had time to come (RESET_AFTER_END_MS): a reset makes the call done, cancelled.
      if (broken !== undefined) setTimeout(end, RESET_AFTER_END_MS, failure(new ProtocolViolation({ detail: broken })))
      else if (streaming) call.endRequest()
      else {
        handled = true
        release()
        runRoute(route, call)
      }
    })
    if (streaming) {
      handled = true
      runRoute(route, call)
    }
  }
}
