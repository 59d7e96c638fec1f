/**
 * `cgn-agent/testing`: the test layers of every service, for the project's own tests and for users
 * who embed or extend the agent. Each replaces its live layer with something in-memory and
 * controllable; none listens on a port or spawns a process unless its name says so.
 */

import * as ConfigLive from "../layers/config/Config.ts"
import * as AdmissionLive from "../layers/grpc/Admission.ts"
import * as TlsLive from "../layers/tls/Tls.ts"
import { Drain } from "../services/node/Drain.ts"
import * as EngineClientTest from "./EngineClient.ts"
import * as EngineProcessTest from "./EngineProcess.ts"
import * as HealthReporterTest from "./HealthReporter.ts"
import * as MetricsTest from "./Metrics.ts"
import * as NodeStatusTestLayers from "./NodeStatus.ts"
import * as NvmlTest from "./Nvml.ts"

export { EngineClientRecorder, type EngineScript, streamOf, textChunk } from "./EngineClient.ts"
export { EngineProcessControl, testPlan } from "./EngineProcess.ts"
export { NodeStatusTest, testNodeHealth } from "./NodeStatus.ts"

/** One test layer per service. */
export const TestLayers = {
  /** Config from an object, validated exactly like a file: `Config({ models: { m: { hf_repo: "org/m" } } })`. */
  Config: ConfigLive.layerFromObject,
  /** A fresh, empty Prometheus registry. */
  Metrics: MetricsTest.layerTest,
  /** An engine whose state the test sets through EngineProcessControl; nothing is spawned. */
  EngineProcess: EngineProcessTest.layerTest,
  /** A scripted engine (`streamTo`; `complete` derives as live); requests go to EngineClientRecorder. */
  EngineClient: EngineClientTest.layerTest,
  /** Admission with explicit limits. */
  Admission: AdmissionLive.layerWith,
  /** NodeHealth set by the test through NodeStatusTest. */
  NodeStatus: NodeStatusTestLayers.layerTest,
  /** An in-memory reporter (needs NodeStatus): records flushes and the drain mark, never talks to etcd. */
  HealthReporter: HealthReporterTest.layerTest,
  /** A fixed GPU list instead of NVML. */
  Nvml: NvmlTest.layerFixed,
  /** The drain lever (a deferred; the same in tests as live). */
  Drain: Drain.layer,
  /** TLS from explicit [security] settings (plaintext when require_mtls is false). */
  Tls: TlsLive.layerWith
} as const
