/**
 * cgn.agent.v1.Agent as the server (http2/Server.ts) sees it: method definitions in grpc-js's
 * MethodDefinition shape from the generated messages (ts-proto's encode/decode) and the handlers. Generate is
 * a server-streaming handler given by the caller (GenerateCall.ts); ListModels and GetNodeHealth are unary
 * handlers here.
 */
import { BinaryReader } from "@bufbuild/protobuf/wire"
import type * as grpc from "@grpc/grpc-js"
import { Cause, type Effect, Exit } from "effect"
import {
  AgentDefinition,
  GenerateRequest,
  GenerateResponse,
  type ListModelsResponse,
  type MessageFns,
  type NodeHealth
} from "../../gen/cgn/agent/v1/agent.ts"
import { AgentDefect } from "../../services/grpc/CallErrors.ts"
import { toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"
import { FLAT, GENERATE_REQUEST, type Shape, wireProblem } from "../../services/grpc/WireShape.ts"
import type { ServerCall, UnaryCallback } from "./http2/Call.ts"
import type { Http2GrpcServer } from "./http2/Server.ts"

/** One Generate call as the handler sees it (the module GenerateCall.ts is the handler). */
export type GenerateServerCall = ServerCall<GenerateRequest, GenerateResponse>

const bytes = (u: Uint8Array): Buffer => Buffer.from(u.buffer, u.byteOffset, u.byteLength)

/**
 * Proto3 strings are UTF-8 (the language spec), and protobuf-go and C++ refuse a message whose strings are not; the
 * generated decoders read them leniently (each invalid sequence as U+FFFD), so a prompt would reach the engine other
 * than sent. This reader reads them strictly: such a request fails to decode (INVALID_ARGUMENT, undecodable_request).
 */
class StrictUtf8Reader extends BinaryReader {
  override string(): string {
    try {
      return super.string(true)
    } catch {
      throw new Error("a string field is not valid UTF-8")
    }
  }
}

/** Decodes a request whose wire format is sound (WireShape.ts: the generated decoders stop silently where it is not). */
const decodeStrict = <T>(type: { decode: (input: BinaryReader) => T }, b: Uint8Array, shape: Shape): T => {
  const problem = wireProblem(b, shape)
  if (problem !== undefined) throw new Error(`not a well-formed protobuf message: ${problem}`)
  return type.decode(new StrictUtf8Reader(b))
}

const path = (method: { readonly name: string }): string => `/${AgentDefinition.fullName}/${method.name}`

/**
 * Generate's definition: the final message encoded as is, without a `fromPartial` copy; the per-token deltas bypass
 * it (DeltaFrame.ts).
 */
const generateMethod: grpc.MethodDefinition<GenerateRequest, GenerateResponse> = {
  path: path(AgentDefinition.methods.generate),
  requestStream: false,
  responseStream: true,
  requestSerialize: (m) => bytes(GenerateRequest.encode(m).finish()),
  requestDeserialize: (b) => decodeStrict(GenerateRequest, b, GENERATE_REQUEST),
  responseSerialize: (m) => bytes(GenerateResponse.encode(m).finish()),
  responseDeserialize: (b) => GenerateResponse.decode(b)
}

interface UnaryDefinition<Req, Res> {
  readonly name: string
  readonly requestType: MessageFns<Req>
  readonly responseType: MessageFns<Res>
}

/** A unary method; its answer goes through `fromPartial`, so a handler may leave default fields out. */
const unaryMethod = <Req, Res>(m: UnaryDefinition<Req, Res>): grpc.MethodDefinition<Req, Res> => ({
  path: path(m),
  requestStream: false,
  responseStream: false,
  requestSerialize: (r) => bytes(m.requestType.encode(r).finish()),
  requestDeserialize: (b) => decodeStrict(m.requestType, b, FLAT),
  responseSerialize: (r) => bytes(m.responseType.encode(m.responseType.fromPartial(r as never)).finish()),
  responseDeserialize: (b) => m.responseType.decode(b)
})

/** Generate's HTTP/2 path, `/cgn.agent.v1.Agent/Generate`. */
export const GENERATE_PATH = generateMethod.path

const definition = {
  generate: generateMethod,
  listModels: unaryMethod(AgentDefinition.methods.listModels),
  getNodeHealth: unaryMethod(AgentDefinition.methods.getNodeHealth)
} satisfies grpc.ServiceDefinition

export interface AgentHandlers {
  readonly generate: (call: GenerateServerCall) => void
  readonly models: ListModelsResponse
  readonly nodeHealth: Effect.Effect<NodeHealth>
  /** Runs an effect to its exit; the function it returns interrupts it. */
  readonly run: <A>(effect: Effect.Effect<A>, onExit: (exit: Exit.Exit<A>) => void) => () => void
}

/** Adds the Agent service to `server`. */
export const addAgent = (server: Http2GrpcServer, handlers: AgentHandlers): void => {
  server.addService(definition, {
    generate: handlers.generate,
    listModels: (_call: ServerCall, done: UnaryCallback<ListModelsResponse>) => done(null, handlers.models),
    getNodeHealth: (call: ServerCall, done: UnaryCallback<NodeHealth>) => {
      // A cancelled call interrupts the snapshot; a call already ended ignores the answer.
      const interrupt = handlers.run(handlers.nodeHealth, (exit) =>
        Exit.isSuccess(exit)
          ? done(null, exit.value)
          : done(toGrpcFailure(new AgentDefect({ detail: Cause.pretty(exit.cause) })))
      )
      call.once("cancelled", interrupt)
    }
  } as unknown as grpc.UntypedServiceImplementation)
}
