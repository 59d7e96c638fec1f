/**
 * NodeHealthView: the pure mapping from the agent's parts to the NodeHealth message: engine state to
 * node state, engine phase and detail; engine load signals with agent-side fallbacks; the tokens/s rate
 * between two readings of the relayed-tokens counter. No I/O: layers/node/NodeStatus.ts gathers the inputs.
 */
import type { BootstrapServer, Gpu, NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"
import type { AgentConfig } from "../config/Config.ts"
import type { LoadSignals } from "../engine/EngineClient.ts"
import type { EngineState, ExitRecord } from "../engine/EngineProcess.ts"
import { describeExit, failingOf } from "../engine/EngineState.ts"
import { isWildcardHost } from "../net/HostPort.ts"
import type { NodeState } from "./NodeStatus.ts"

/**
 * Ready -> ready; Starting/Restarting -> starting, unhealthy once failing (several runs in a row failed);
 * Unhealthy -> unhealthy, but starting for an operator's restart (POST /engine/restart: the engine is being restarted
 * on purpose, no fault; a chaos soak saw it blip node_state and etcd to unhealthy); a drain wins over all (it is final), then an operator's cordon (the node is out of
 * traffic whatever else is true; the engine's detail still says what is wrong with it), then a problem outside the
 * engine's state (a faulty GPU, GPU memory held past gpu_free_timeout, a stalled engine) makes the node unhealthy
 * whatever the engine says.
 */
export const nodeState = (engine: EngineState, draining: boolean, problem?: string, cordoned = false): NodeState => {
  if (draining) return "draining"
  if (cordoned) return "cordoned"
  if (problem !== undefined) return "unhealthy"
  switch (engine._tag) {
    case "Ready":
      return "ready"
    case "Starting":
    case "Restarting":
      return engine.failing === undefined ? "starting" : "unhealthy"
    case "Unhealthy":
      return engine.ending?.kind === "requested" && engine.ending.source === "admin" ? "starting" : "unhealthy"
    // Stopping or Stopped without a drain: the supervisor gave up or is shutting down; not servable.
    case "Stopping":
    case "Stopped":
      return "unhealthy"
  }
}

/**
 * The supervisor phase as the proto spells it, and cgn_agent_engine_state's `state` label. Every Unhealthy is a run
 * being torn down (layers/engine/watch.ts, runOnce.ts), and the etcd record carries each at once; the word tells why:
 * "stopping" when the engine exited or a restart was asked for, "unhealthy" when its health ended it (the liveness
 * probe, the startup timeout). Kept as they were when "stopping" also kept the first out of the flap damping (gone):
 * routers and dashboards read these words.
 */
export const enginePhase = (engine: EngineState): string =>
  engine._tag === "Unhealthy" && engine.ending !== undefined ? "stopping" : engine._tag.toLowerCase()

/**
 * One line on the phase: why it is failing, the probe phase, the liveness failure, the next restart, the last exit.
 * `gpuWaiting`: the start waits for the engine's GPUs (the GPU gate: memory held, a fault), so nothing is spawning yet.
 */
export const engineDetail = (engine: EngineState, now: number, gpuWaiting = false): string => {
  const failing = failingOf(engine)
  const detail = phaseDetail(engine, now, gpuWaiting, failing !== undefined)
  return failing === undefined ? detail : `${failing}; ${detail}`
}

/**
 * The run that ended, without its status and hint: what a failing Restarting's detail adds to `failing`, which says
 * them already (EngineState.ts failingReason, made from the same exit: the Exited transition sets both). Told
 * twice, the detail read "... exited (exit code 1); hint: X; still retrying ...; restart 10 in 1s; run 9 (pid P)
 * ended: exited, exit code 1, after 0.2 s; hint: X" (a lifecycle review).
 */
const endedRun = (exit: ExitRecord): string =>
  `run ${exit.run} (pid ${exit.pid ?? "-"}) ended after ${(exit.runtimeMs / 1000).toFixed(1)} s`

const phaseDetail = (engine: EngineState, now: number, gpuWaiting: boolean, failing: boolean): string => {
  switch (engine._tag) {
    case "Starting": {
      // the gate waits before the spawn, in the run's first phase
      const phase = gpuWaiting && engine.phase === "spawning" ? "waiting for the engine's GPUs" : engine.phase
      return `${phase} for ${Math.max(0, Math.round((now - engine.since) / 1000))}s (run ${engine.run})`
    }
    case "Ready":
      return ""
    case "Unhealthy":
      return engine.reason
    case "Restarting": {
      const inSeconds = Math.max(0, Math.ceil((engine.nextAt - now) / 1000))
      const ended = failing ? endedRun(engine.lastExit) : describeExit(engine.lastExit)
      return `restart ${engine.attempt} in ${inSeconds}s; ${ended}`
    }
    case "Stopping":
      return "stopping"
    case "Stopped":
      return engine.lastExit ? describeExit(engine.lastExit) : "stopped"
  }
}

/** Tokens per second between two readings of a monotonically growing counter (0 on reset or no time). */
export const ratePerSecond = (
  previous: { readonly total: number; readonly at: number },
  current: { readonly total: number; readonly at: number }
): number => {
  const dt = (current.at - previous.at) / 1000
  const dn = current.total - previous.total
  if (dt <= 0 || dn < 0) return 0
  return Math.round((dn / dt) * 100) / 100
}

export interface NodeHealthInputs {
  readonly config: AgentConfig
  readonly agentVersion: string
  readonly advertiseAddr: string
  readonly engine: EngineState
  readonly restarts: number
  readonly draining: boolean
  /** An operator's cordon (POST /cordon); absent: not cordoned. */
  readonly cordoned?: boolean
  /** Undefined when the engine could not be scraped (not ready, no metrics, error). */
  readonly signals: LoadSignals | undefined
  readonly inflight: number
  readonly queued: number
  readonly tokensPerSecond: number
  readonly gpus: ReadonlyArray<Gpu>
  /** The engine's GPUs (NVML indices); empty when unknown. */
  readonly engineGpus: ReadonlyArray<number>
  /** The MIG device the engine is given (its UUID as NVML reports it), on the GPU in `engineGpus`; absent: none. */
  readonly engineMigDevice?: string | undefined
  /**
   * A fact outside the engine's state that makes the node unhealthy (services/engine/GpuGate.ts `gateProblem`,
   * services/engine/EngineStall.ts `stallProblem`), or undefined.
   */
  readonly problem: string | undefined
  /** The GPU gate holds the start (services/engine/GpuGate.ts `waiting`): the engine is not being spawned yet. */
  readonly gpuWaiting?: boolean
  readonly now: number
  /** An SGLang prefill node's engine bootstrap server (bootstrapServer below); absent elsewhere. */
  readonly bootstrap?: BootstrapServer | undefined
  /** A P/D node's KV transfer backend (LaunchPlan.kvTransfer); absent on role both. */
  readonly kvTransfer?: string | undefined
  /** The context one request can use (ServedContext.ts requestContext), in tokens; absent: not known. */
  readonly maxModelLen?: number | undefined
}

/**
 * Where decode engines reach a prefill engine's bootstrap server: the engine's listen host (SGLang binds the server
 * to its --host), or the node's advertised host where that is a wildcard (an address no peer can dial).
 */
export const bootstrapServer = (engineHost: string, advertisedHost: string, port: number): BootstrapServer => ({
  host: isWildcardHost(engineHost) ? advertisedHost : engineHost,
  port
})

/** The NodeHealth message, freshness left empty (only the etcd writer knows epoch and sequence). */
export const buildNodeHealth = (i: NodeHealthInputs): NodeHealth => ({
  nodeId: i.config.agent.node_id,
  cluster: i.config.cluster.name,
  agentVersion: i.agentVersion,
  advertiseAddr: i.advertiseAddr,
  role: i.config.agent.role,
  state: nodeState(i.engine, i.draining, i.problem, i.cordoned),
  engine: {
    kind: i.config.engine.kind,
    model: i.config.model.served_name,
    phase: enginePhase(i.engine),
    restarts: i.restarts,
    detail: [i.problem, engineDetail(i.engine, i.now, i.gpuWaiting)].filter((d) => d).join("; ")
  },
  load: {
    inflight: i.inflight,
    queued: i.queued,
    // the proto promises the agent-side count where the engine reports none
    engineRunning: i.signals?.running ?? i.inflight,
    engineWaiting: i.signals?.waiting ?? 0,
    kvUsage: i.signals?.kvUsage ?? -1,
    tokensPerSecond: i.tokensPerSecond
  },
  capacity: {
    maxInflight: i.config.agent.max_inflight,
    maxQueue: i.config.agent.max_queue,
    gpus: [...i.gpus],
    dp: i.config.model.dp,
    engineGpus: [...i.engineGpus],
    engineMigDevice: i.engineMigDevice ?? "",
    maxModelLen: i.maxModelLen ?? 0
  },
  freshness: { epoch: "", sequence: 0, writtenAt: "", heartbeatMs: 0 },
  ...(i.bootstrap === undefined ? {} : { bootstrap: i.bootstrap }),
  kvTransfer: i.kvTransfer ?? ""
})
