// A Generate call as the handler (layers/grpc/GenerateCall.ts) uses one, made by a test instead of the gRPC server:
// its request, no metadata or deadline, the frames written counted, and the status it ended with.
import { EventEmitter } from "node:events"
import { GenerateRequest } from "../../src/gen/cgn/agent/v1/agent.ts"
import type { GrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"

export class FakeCall extends EventEmitter {
  readonly request: GenerateRequest
  constructor(request: GenerateRequest = GenerateRequest.fromPartial({ prompt: "a" })) {
    super()
    this.request = request
  }
  readonly metadata = { get: (): Array<string> => [] }
  /** No grpc-timeout sent. */
  remainingMs(): number | undefined {
    return undefined
  }
  cancelled = false
  frames = 0
  status: GrpcFailure | undefined = undefined
  writeFrame(): boolean {
    this.frames++
    return true
  }
  write(): boolean {
    return true
  }
  sendHeaders(): void {}
  end(): void {
    this.status ??= { code: 0, message: "", trailers: {} }
  }
  sendStatus(f: GrpcFailure): void {
    this.status ??= f
  }
}
