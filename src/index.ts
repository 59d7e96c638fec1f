/**
 * cgn-agent as a library: the service interfaces and their live layers, for embedding the agent or
 * composing a variant of it. The daemon itself is `runDaemon` (programs/main.ts); test layers are in
 * `cgn-agent/testing`.
 */
export * as AdminHttp from "./layers/AdminHttp.ts"
export * as AdmissionLive from "./layers/Admission.ts"
export * as ConfigLive from "./layers/Config.ts"
export * as EngineClientLive from "./layers/EngineClient.ts"
export * as EngineProcessLive from "./layers/EngineProcess.ts"
export { engineFor, planLayer } from "./layers/engines/index.ts"
export * as GrpcServerLive from "./layers/GrpcServer.ts"
export * as HealthReporterLive from "./layers/HealthReporter.ts"
export * as NodeStatusLive from "./layers/NodeStatus.ts"
export { coreLayer, daemon, runDaemon } from "./programs/main.ts"
export * from "./services/Admission.ts"
export * from "./services/Config.ts"
export * from "./services/Drain.ts"
export * from "./services/Engine.ts"
export * from "./services/EngineClient.ts"
export * from "./services/EngineProcess.ts"
export * from "./services/GrpcServer.ts"
export * from "./services/HealthReporter.ts"
export * from "./services/Metrics.ts"
export * from "./services/NodeStatus.ts"
