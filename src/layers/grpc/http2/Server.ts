/**
 * The agent's gRPC server: gRPC over node:http2 (grpc/grpc doc/PROTOCOL-HTTP2.md), serving services given
 * as grpc-js ServiceDefinitions through `addService`, the method grpc-health-check and @grpc/reflection add
 * themselves with. Served here rather than by grpc-js's Server for two measured reasons (docs/bench.md):
 * the per-call and per-token CPU of the relay (grpc-js's server stack was most of what the agent adds), and
 * HTTP/2 settings grpc-js does not expose: Node's rapid-reset guard (streamResetBurst/Rate) cut a router's
 * burst of cancels short with INTERNAL.
 * Routing, the request's framing and decoding, deadlines and the listener's lifecycle live here; one call's
 * responses in Call.ts.
 */

import * as http2 from "node:http2"
import type * as net from "node:net"
import type * as grpc from "@grpc/grpc-js"
import { AgentDefect } from "../../../services/grpc/CallErrors.ts"
import { type GrpcFailure, handlerFailure, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import {
  CallCancelled,
  CallDeadlineExceeded,
  MessageTooLarge,
  ProtocolViolation,
  RequestsOverBudget,
  type TransportError,
  UnknownMethod
} from "../../../services/grpc/TransportErrors.ts"
import { isGrpcContentType, MessageReader, parseTimeout } from "../../../services/grpc/Wire.ts"
import type { TlsSource } from "../../../services/tls/Tls.ts"
import { ServerCall, type UnaryCallback } from "./Call.ts"
import { type Decoder, decode } from "./decodeMessage.ts"
import { MAX_HEADER_LIST_BYTES, MAX_HEADER_LIST_PAIRS } from "./headerLimits.ts"

export interface Http2GrpcServerOptions {
  /** The largest request message accepted, decompressed (bytes); a larger one ends RESOURCE_EXHAUSTED. */
  readonly maxReceiveMessageLength: number
  /** mTLS: client certificates must chain to the CA; plaintext (h2c) when absent. */
  readonly tls?: TlsSource | undefined
  /**
   * A listening socket's error after listen (a failed accept; libuv absorbs EMFILE itself): reported here, the
   * server goes on. Without a listener Node would throw it and end the daemon.
   */
  readonly onError?: ((error: Error) => void) | undefined
  /**
   * One connection's error (a client breaking HTTP/2, a TLS handshake refused: no or an untrusted client
   * certificate). The connection closes, its calls see 'cancelled'; the server goes on.
   */
  readonly onConnectionError?: ((error: Error) => void) | undefined
  /**
   * A call that ended before its handler ran, with the status the server sent: no such method, a bad
   * grpc-timeout or message, its deadline passed or the caller cancelled while the request was arriving.
   * The handler's own metrics never see these calls; `code` is the status sent (CANCELLED for a cancel).
   */
  readonly onRejected?: ((path: string, code: number) => void) | undefined
  /**
   * Bytes of requests still arriving, on all connections together (received before their handlers run), past
   * which a request's next bytes end it RESOURCE_EXHAUSTED. Admission bounds the calls a handler runs; this
   * bounds what callers that send slowly, or stop halfway, hold before that. Default: no limit.
   */
  readonly maxArrivingBytes?: number | undefined
}

/**
 * Node's guard against HTTP/2 rapid reset (CVE-2023-44487) closes a connection whose client reset more than
 * `streamResetBurst` streams, refilled at `streamResetRate` per second; its defaults (1000, 33/s) end a
 * router's cancel of 2000 hedged calls with INTERNAL on every call of the connection. A cancel costs the
 * agent an aborted engine request, and admission bounds the calls in flight, so the guard is kept but sized
 * for a router: 10x the burst, 30x the rate.
 */
export const STREAM_RESET_BURST = 10_000
export const STREAM_RESET_RATE = 1_000

type Kind = "unary" | "serverStream" | "clientStream" | "bidi"

interface Route {
  readonly kind: Kind
  readonly definition: grpc.MethodDefinition<unknown, unknown>
  readonly handler: (...args: Array<unknown>) => void
}

const kindOf = (d: grpc.MethodDefinition<unknown, unknown>): Kind =>
  d.requestStream ? (d.responseStream ? "bidi" : "clientStream") : d.responseStream ? "serverStream" : "unary"

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

/** The status of a call its caller cancelled, from the status table. */
const CANCELLED = failure(new CallCancelled()).code
/** The end of a call whose grpc-timeout passed (made once: an error built per call costs every call). */
const DEADLINE = failure(new CallDeadlineExceeded())

export class Http2GrpcServer {
  readonly #routes = new Map<string, Route>()
  readonly #sessions = new Set<http2.ServerHttp2Session>()
  readonly #options: Http2GrpcServerOptions
  #server: http2.Http2Server | http2.Http2SecureServer | undefined
  /** Bytes received on streams whose handler has not run yet (maxArrivingBytes). */
  #arriving = 0
  #unsubscribe: (() => void) | undefined
  /** Set by close() and destroy(): what a connection still in its TLS handshake then gets once it is one. */
  #closing: "close" | "destroy" | undefined

  constructor(options: Http2GrpcServerOptions) {
    this.#options = options
  }

  /** Adds a service's methods (grpc-js's `Server.addService` shape). */
  addService(service: grpc.ServiceDefinition, implementation: grpc.UntypedServiceImplementation): void {
    for (const name in service) {
      const definition = service[name] as grpc.MethodDefinition<unknown, unknown>
      const handler = implementation[name] ?? implementation[definition.originalName ?? ""]
      if (handler === undefined) continue
      this.#routes.set(definition.path, { kind: kindOf(definition), definition, handler: handler as Route["handler"] })
    }
  }

  /** Listens on `host`:`port`; resolves with the bound port (the real one for port 0). */
  listen(host: string, port: number): Promise<number> {
    const settings: http2.ServerOptions = {
      // As grpc-js: Node's 10 MB session memory cap degrades badly when reached; admission bounds calls instead.
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      maxSendHeaderBlockLength: Number.MAX_SAFE_INTEGER,
      streamResetBurst: STREAM_RESET_BURST,
      streamResetRate: STREAM_RESET_RATE,
      // Metadata is limited on bytes, not on Node's default count of 128 fields (headerLimits.ts).
      maxHeaderListPairs: MAX_HEADER_LIST_PAIRS,
      settings: { maxHeaderListSize: MAX_HEADER_LIST_BYTES }
    }
    const tls = this.#options.tls
    const server =
      tls === undefined
        ? http2.createServer(settings)
        : http2.createSecureServer({
            ...settings,
            ...tls.current(),
            requestCert: true,
            rejectUnauthorized: true,
            ALPNProtocols: ["h2"]
          })
    if (tls !== undefined) {
      const secure = server as http2.Http2SecureServer
      this.#unsubscribe = tls.subscribe((m) => secure.setSecureContext({ ca: m.ca, cert: m.cert, key: m.key }))
    }
    this.#server = server
    const connectionError = (e: Error): void => this.#options.onConnectionError?.(e)
    server.on("session", (session) => {
      this.#sessions.add(session)
      // Errors end the session, and 'close' follows: its streams see 'cancelled' there.
      session.on("error", connectionError)
      session.once("close", () => this.#sessions.delete(session))
      // Accepted before close() or destroy(), its handshake done after: it must not take calls, nor hold close().
      if (this.#closing !== undefined) session[this.#closing]()
    })
    server.on("tlsClientError", connectionError)
    // Each relayed token is a small write after one still unacknowledged: Nagle's algorithm would hold it back.
    server.on("connection", (socket: net.Socket) => socket.setNoDelay(true))
    server.on("stream", (stream, headers) => this.#onStream(stream, headers))
    return new Promise((resolve, reject) => {
      // Not listening: nothing will close this server, so its certificate subscription ends here.
      const failed = (e: Error): void => {
        this.#unsubscribe?.()
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
   * resolves when every connection has closed.
   */
  close(): Promise<void> {
    const server = this.#server
    this.#unsubscribe?.()
    if (server === undefined || !server.listening) return Promise.resolve()
    this.#closing = "close"
    const closed = new Promise<void>((resolve) => server.close(() => resolve()))
    for (const s of this.#sessions) s.close()
    return closed
  }

  /** Closes every connection now: their running calls see 'cancelled'. */
  destroy(): void {
    this.#unsubscribe?.()
    this.#closing = "destroy"
    for (const s of this.#sessions) s.destroy()
    if (this.#server?.listening) this.#server.close()
  }

  #onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    if (headers[":method"] !== "POST" || !isGrpcContentType(headers["content-type"])) {
      refuse(stream, headers[":method"] !== "POST" ? 405 : 415)
      return
    }
    const path = headers[":path"] ?? ""
    const route = this.#routes.get(path)
    const call = new ServerCall<unknown, unknown>(stream, headers, route?.definition.responseSerialize ?? noBody)
    // Until the handler runs, every end of the call is the server's: reported through onRejected. What the
    // request holds of the arriving budget (every byte until then) is given back at the handler or at that end.
    let handled = false
    let held = 0
    const release = (): void => {
      this.#arriving -= held
      held = 0
    }
    const reject = (f: GrpcFailure): void => {
      if (call.done) return
      release()
      call.sendStatus(f)
      this.#options.onRejected?.(path, f.code)
    }
    if (route === undefined) {
      reject(failure(new UnknownMethod({ path })))
      return
    }
    const timeout = parseTimeout(headers["grpc-timeout"] as string | undefined)
    if (timeout === "invalid") {
      const detail = `invalid grpc-timeout "${headers["grpc-timeout"]}"`
      reject(failure(new ProtocolViolation({ detail })))
      return
    }
    if (timeout !== undefined) call.endAt(timeout, DEADLINE)
    call.once("cancelled", (why: "cancelled" | "deadline") => {
      if (handled) return
      release()
      this.#options.onRejected?.(path, why === "deadline" ? DEADLINE.code : CANCELLED)
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
    stream.on("data", (chunk: Buffer) => {
      if (call.done) return
      if (!handled) {
        if (this.#arriving + chunk.length > budget)
          return reject(failure(new RequestsOverBudget({ limitBytes: budget })))
        held += chunk.length
        this.#arriving += chunk.length
      }
      const f = onMessages(chunk)
      if (f !== undefined) end(f)
    })
    stream.once("end", () => {
      // A caller's reset ends the request too: that is its cancel ('cancelled' on close), not a short message.
      if (call.done || stream.aborted) return
      if (reader.pending > 0) end(failure(new ProtocolViolation({ detail: "the request ended inside a message" })))
      else if (streaming) call.endRequest()
      else if (received === 0) reject(failure(new ProtocolViolation({ detail: "the request carried no message" })))
      else {
        handled = true
        release()
        this.#run(route, call)
      }
    })
    if (streaming) {
      handled = true
      this.#run(route, call)
    }
  }

  #run(route: Route, call: ServerCall<unknown, unknown>): void {
    try {
      if (route.kind === "serverStream" || route.kind === "bidi") {
        route.handler(call)
        return
      }
      const done: UnaryCallback = (error, value) => {
        if (error !== null && error !== undefined) call.sendStatus(handlerFailure(error))
        else {
          call.write(value)
          call.end()
        }
      }
      route.handler(call, done)
    } catch (e) {
      // A handler that throws is a bug in the agent: the call ends INTERNAL, the server goes on.
      call.sendStatus(toGrpcFailure(new AgentDefect({ detail: e instanceof Error ? e.message : String(e) })))
    }
  }
}
