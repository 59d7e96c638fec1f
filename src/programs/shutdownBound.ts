/**
 * The longest a shutdown (SIGTERM, SIGINT or POST /drain) can take, from the signal to the process's exit, with
 * every peer hung: etcd partitioned, an engine that ignores SIGTERM, a router that holds its streams, kvcached and
 * the OTLP collector silent, NVML slow. Each step of the ordered drain and of the release after it is bounded on
 * its own (the module named at each term); this adds them up, so that an operator can set Kubernetes'
 * terminationGracePeriodSeconds from the config (README "Running the daemon", examples/k8s). The drain logs it
 * (`exit_within`), and test/programs/k8s-manifests.test.ts holds the shipped DaemonSet to it.
 *
 * The KV-event readers add nothing: their fibers are interrupted, which a wedged peer cannot hold up. The kvcached
 * link adds at most 1 s (layers/kv/kvcachedClient.ts STOP_BOUND_MS, stopLink): up to half of it waiting for kvcached
 * to acknowledge what it was sent last (the engine stop's restart Resync), then the call in progress cancelled with a
 * message to kvcached, which effect's RpcClient writes uninterruptibly with a 1 s timeout
 * (effect/src/rpc/RpcClient.ts, `sendInterrupt`), past the bound left to finish in the background. An NVML worker still inside a call past its term does not hold the exit either (layers/node/processExit.ts
 * exits without joining it); only a call stuck in an uninterruptible kernel wait (D state) keeps the process,
 * which not even SIGKILL ends.
 */
import { Duration } from "effect"
import { CLOSE_GRACE as ADMIN_CLOSE_GRACE } from "../layers/admin/Admin.ts"
import { STOP_SLACK_MS as ENGINE_STOP_SLACK_MS } from "../layers/engine/run.ts"
import { EXIT_REPORT_WAIT_MS } from "../layers/engine/runOnce.ts"
import { CLOSE_GRACE as GRPC_CLOSE_GRACE } from "../layers/grpc/GrpcServer.ts"
import { STOP_BOUND_MS as KVCACHED_STOP_MS } from "../layers/kv/kvcachedClient.ts"
import { CALL_TIMEOUT as NVML_CALL_TIMEOUT } from "../layers/node/Nvml.ts"
import { FLUSH_WAIT_MS } from "../layers/node/processExit.ts"
import { FLUSH_MS as XID_FLUSH_MS } from "../layers/node/xidRecordWriter.ts"
import { SDK_SHUTDOWN_TIMEOUT, TRACE_FLUSH_TIMEOUT } from "../layers/observability/Tracing.ts"
import { CALL_DEADLINE_SLACK_MS } from "../layers/registry/etcdClient.ts"
import { REMOVE_BOUND_MS as LEASE_RECORD_REMOVE_MS } from "../layers/registry/leaseRecord.ts"
import type { AgentConfig } from "../services/config/Config.ts"
import { type Env, otlpTraceSettings } from "../services/observability/OtelSettings.ts"
import { reporterTiming } from "../services/registry/ReporterTiming.ts"

/** Room for the event loop of a loaded host between the steps. */
export const MARGIN_MS = 1_000

export interface ShutdownTerm {
  readonly step: string
  readonly ms: number
}

/**
 * Each step's bound, in the order a shutdown runs them; a step the config does not have (no etcd, no traces) is
 * left out.
 */
export const shutdownTerms = (config: AgentConfig, env: Env = process.env): ReadonlyArray<ShutdownTerm> => {
  const { agent, engine, cluster } = config
  const etcd = cluster.etcd.length > 0
  const callMs = reporterTiming(agent.heartbeat, agent.lease_ttl).callTimeoutMs + CALL_DEADLINE_SLACK_MS
  const traces = otlpTraceSettings(agent.otlp_endpoint, env) !== undefined
  const terms: Array<ShutdownTerm | undefined> = [
    // programs/main.ts orderedDrain: the draining write is given one heartbeat
    etcd
      ? { step: "state=draining written to etcd (agent.heartbeat)", ms: Duration.toMillis(agent.heartbeat) }
      : undefined,
    { step: "in-flight streams (agent.drain_timeout)", ms: Duration.toMillis(agent.drain_timeout) },
    // layers/engine/run.ts: past stop_grace, the guard's SIGKILL, a hung guard killed, the group's, the last output;
    // then layers/engine/runOnce.ts's wait for the guard's exit report (a group that survived SIGKILL sends none)
    {
      step: "engine stopped (engine.stop_grace + kill and confirm)",
      ms: Duration.toMillis(engine.stop_grace) + ENGINE_STOP_SLACK_MS + EXIT_REPORT_WAIT_MS
    },
    // layers/registry/HealthReporter.ts shutdown: the revoke alone once etcd left the drain's write unanswered
    etcd ? { step: "etcd lease revoked (one etcd call)", ms: callMs } : undefined,
    // layers/registry/leaseRecord.ts: the revoked lease's record in agent.state_dir removed (a hung mount's wait)
    etcd ? { step: "etcd lease record removed (agent.state_dir)", ms: LEASE_RECORD_REMOVE_MS } : undefined,
    { step: "gRPC server closed", ms: Duration.toMillis(GRPC_CLOSE_GRACE) },
    { step: "admin server closed", ms: Duration.toMillis(ADMIN_CLOSE_GRACE) },
    // layers/kv/kvcachedClient.ts STOP_BOUND_MS: the wait for kvcached's last acknowledgement and the cancel (see above)
    config.kv.events && config.kv.uds !== undefined
      ? { step: "kvcached told of the last call's end", ms: KVCACHED_STOP_MS }
      : undefined,
    traces
      ? {
          step: "last spans flushed",
          ms: Duration.toMillis(TRACE_FLUSH_TIMEOUT) + Duration.toMillis(SDK_SHUTDOWN_TIMEOUT)
        }
      : undefined,
    // layers/node/xidRecordWriter.ts: an in-flight write of the GPU Xid record, and the last change
    { step: "GPU Xid record written", ms: XID_FLUSH_MS },
    { step: "NVML shut down", ms: Duration.toMillis(NVML_CALL_TIMEOUT) },
    { step: "last log lines taken by stdout's and stderr's readers", ms: FLUSH_WAIT_MS },
    { step: "margin", ms: MARGIN_MS }
  ]
  return terms.filter((t): t is ShutdownTerm => t !== undefined)
}

/** The worst-case time from the signal to the exit. */
export const shutdownBound = (config: AgentConfig, env: Env = process.env): Duration.Duration =>
  Duration.millis(shutdownTerms(config, env).reduce((sum, t) => sum + t.ms, 0))
