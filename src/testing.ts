/**
 * `cgn-agent/testing`: the test layers of every service, for the project's own tests and for users
 * who embed or extend the agent. Each replaces its live layer with something in-memory and
 * controllable; none listens on a port or spawns a process unless its name says so.
 */
import * as AdmissionLive from "./layers/Admission.ts"
import * as ConfigLive from "./layers/Config.ts"
import * as EngineClientTest from "./layers/EngineClientTest.ts"
import * as EngineProcessTest from "./layers/EngineProcessTest.ts"
import * as HealthReporterTest from "./layers/HealthReporterTest.ts"
import * as MetricsLive from "./layers/Metrics.ts"
import * as NodeStatusLive from "./layers/NodeStatus.ts"
import * as NvmlProbe from "./layers/NvmlProbe.ts"
import * as TlsLive from "./layers/Tls.ts"
import { Drain } from "./services/Drain.ts"

export { EngineClientRecorder, type EngineScript, textChunk } from "./layers/EngineClientTest.ts"
export { EngineProcessControl, testPlan } from "./layers/EngineProcessTest.ts"
export { NodeStatusTest, testNodeHealth } from "./layers/NodeStatus.ts"

/** One test layer per service. */
export const TestLayers = {
  /** Config from an object, validated exactly like a file: `Config({ models: { m: { hf_repo: "org/m" } } })`. */
  Config: ConfigLive.layerFromObject,
  /** A fresh, empty Prometheus registry. */
  Metrics: MetricsLive.layerTest,
  /** An engine whose state the test sets through EngineProcessControl; nothing is spawned. */
  EngineProcess: EngineProcessTest.layerTest,
  /** A scripted engine API; requests are recorded in EngineClientRecorder. */
  EngineClient: EngineClientTest.layerTest,
  /** Admission with explicit limits. */
  Admission: AdmissionLive.layerWith,
  /** NodeHealth set by the test through NodeStatusTest. */
  NodeStatus: NodeStatusLive.layerTest,
  /** An in-memory reporter (needs NodeStatus): records flushes and the drain mark, never talks to etcd. */
  HealthReporter: HealthReporterTest.layerTest,
  /** A fixed GPU list instead of NVML. */
  Nvml: NvmlProbe.layerFixed,
  /** The drain lever (a deferred; the same in tests as live). */
  Drain: Drain.layer,
  /** TLS from explicit [security] settings (plaintext when require_mtls is false). */
  Tls: TlsLive.layerWith
} as const
