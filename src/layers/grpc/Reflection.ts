/**
 * Server reflection (grpc.reflection.v1 and v1alpha, which older clients such as grpcurl before 1.8.8 speak
 * only) by the grpc-js team's `@grpc/reflection`, over the committed FileDescriptorSet of proto/
 * (src/gen/descriptor.ts), read with @grpc/proto-loader's public `loadFileDescriptorSetFromBuffer`.
 */
import { loadFileDescriptorSetFromBuffer } from "@grpc/proto-loader"
import { ReflectionService } from "@grpc/reflection"
import { fileDescriptorSet } from "../../gen/descriptor.ts"
import type { Http2GrpcServer } from "./http2/Server.ts"

/** Adds reflection for `services` (fully qualified names) to `server` (it takes any `addService`). */
export const addReflection = (server: Http2GrpcServer, services: Array<string>): void => {
  const definition = loadFileDescriptorSetFromBuffer(Buffer.from(fileDescriptorSet))
  new ReflectionService(definition, { services }).addToServer(server)
}
