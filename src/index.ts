/**
 * cgn-agent as a library: the service interfaces and their live layers, for embedding the agent or
 * composing a variant of it. The daemon itself is `runDaemon` (programs/main.ts); test layers are in
 * `cgn-agent/testing`.
 */
export * as AdminLive from "./layers/admin/Admin.ts"
export * as ConfigLive from "./layers/config/Config.ts"
export { engineFor } from "./layers/engine/backends/index.ts"
export * as EngineClientLive from "./layers/engine/EngineClient.ts"
export * as EngineHostLive from "./layers/engine/EngineHost.ts"
export { planLayer } from "./layers/engine/EnginePlan.ts"
export * as EngineProcessLive from "./layers/engine/EngineProcess.ts"
export * as AdmissionLive from "./layers/grpc/Admission.ts"
export * as GrpcServerLive from "./layers/grpc/GrpcServer.ts"
export * as NodeStatusLive from "./layers/node/NodeStatus.ts"
export * as HealthReporterLive from "./layers/registry/HealthReporter.ts"
export { coreLayer, daemon, runDaemon } from "./programs/main.ts"
export { guardEntry } from "./programs/programPaths.ts"
export * from "./services/config/Config.ts"
export * from "./services/engine/Engine.ts"
export * from "./services/engine/EngineClient.ts"
export * from "./services/engine/EngineHost.ts"
export * from "./services/engine/EngineProcess.ts"
export * from "./services/grpc/Admission.ts"
export * from "./services/grpc/GrpcServer.ts"
export * from "./services/node/Drain.ts"
export * from "./services/node/NodeStatus.ts"
export * from "./services/observability/Metrics.ts"
export * from "./services/registry/HealthReporter.ts"
