/**
 * Attaches nice-grpc service implementations to a grpc-js Server the agent builds itself, so that one
 * method (Agent.Generate) can be a raw grpc-js handler while the others stay nice-grpc code. Uses
 * nice-grpc's own (internal, untyped) handler factories and definition converters, exactly as its
 * `Server.listen` does: errors, metadata and cancellation behave as under `createServer`.
 */
import { createRequire } from "node:module"
import type * as grpc from "@grpc/grpc-js"
import type { CompatServiceDefinition } from "nice-grpc"

type AnyImpl = (...args: Array<never>) => unknown
type Factory = (definition: NiceMethod, implementation: AnyImpl, middleware: undefined) => grpc.UntypedHandleCall
interface NiceMethod {
  readonly requestStream: boolean
  readonly responseStream: boolean
}

const require = createRequire(import.meta.url)
const defs = require("nice-grpc/lib/service-definitions/index.js") as {
  normalizeServiceDefinition(d: CompatServiceDefinition): Record<string, NiceMethod>
  toGrpcJsServiceDefinition(d: Record<string, NiceMethod>): grpc.ServiceDefinition
}
const factory = (file: string, name: string): Factory =>
  (require(`nice-grpc/lib/server/${file}.js`) as Record<string, Factory>)[name]!
const unary = factory("handleUnaryCall", "createUnaryMethodHandler")
const serverStreaming = factory("handleServerStreamingCall", "createServerStreamingMethodHandler")
const clientStreaming = factory("handleClientStreamingCall", "createClientStreamingMethodHandler")
const bidi = factory("handleBidiStreamingCall", "createBidiStreamingMethodHandler")

/**
 * Adds `definition` to `server` with `implementation` (a nice-grpc implementation); methods named in `raw`
 * are served by the given grpc-js definition and handler instead.
 */
export const addNiceService = (
  server: grpc.Server,
  definition: CompatServiceDefinition,
  implementation: object,
  raw: Record<string, readonly [method: object, handler: grpc.UntypedHandleCall]> = {}
): void => {
  const normalized = defs.normalizeServiceDefinition(definition)
  const grpcDefinition: Record<string, object> = { ...defs.toGrpcJsServiceDefinition(normalized) }
  const handlers: Record<string, grpc.UntypedHandleCall> = {}
  for (const [name, method] of Object.entries(normalized)) {
    const own = raw[name]
    if (own !== undefined) {
      grpcDefinition[name] = own[0]
      handlers[name] = own[1]
      continue
    }
    const impl = (implementation as Record<string, AnyImpl>)[name]!.bind(implementation)
    const make = method.requestStream
      ? method.responseStream
        ? bidi
        : clientStreaming
      : method.responseStream
        ? serverStreaming
        : unary
    handlers[name] = make(method, impl, undefined)
  }
  server.addService(grpcDefinition as grpc.ServiceDefinition, handlers)
}
