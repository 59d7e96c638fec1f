// An agent's real gRPC server in process, in front of a simulator (its EngineClient live, engine and node
// status test layers set Ready), and a collector of one Generate call's messages, status and trailer.
// Shared by the P/D and the SSE error tests.
import { Layer, Logger, ManagedRuntime } from "effect"
import { type Channel, ClientError, createChannel, createClient, type Metadata, Status } from "nice-grpc"
import {
  type AgentClient,
  AgentDefinition,
  type GenerateFinal,
  type GenerateRequest
} from "../../src/gen/cgn/agent/v1/agent.ts"
import { layer as admissionLayer } from "../../src/layers/grpc/Admission.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { agentDeps } from "./agentDeps.ts"

export interface Agent {
  readonly client: AgentClient
  /** host:port of its gRPC server (for a grpc-js client: nice-grpc sends no grpc-timeout). */
  readonly address: string
  /** What the agent logged, each line's message and its fields. */
  readonly logs: ReadonlyArray<{ readonly message: string; readonly fields: unknown }>
  close(): Promise<void>
}

export const startAgent = async (
  engineUrl: string,
  kind: "vllm" | "sglang" | "llama_cpp",
  agent: Record<string, unknown>
): Promise<Agent> => {
  const { config, deps: base } = agentDeps(engineUrl, {
    kind,
    agent: { node_id: `node-${String(agent.role)}`, ...agent },
    engine: { kv_offload: agent.role === "both" ? "none" : "nixl" }
  })
  const logs: Array<{ message: string; fields: unknown }> = []
  const capture = Logger.make(({ message }) => {
    const [text, fields] = [message].flat()
    logs.push({ message: String(text), fields })
  })
  const deps = Layer.mergeAll(base, admissionLayer.pipe(Layer.provide(config)), Logger.layer([capture]))
  const rt = ManagedRuntime.make(
    grpcLayerWith({ address: "127.0.0.1:0", shutdownGraceMs: 500 }).pipe(Layer.provideMerge(deps))
  )
  const server = await rt.runPromise(GrpcServer)
  const channel: Channel = createChannel(server.address)
  return {
    client: createClient(AgentDefinition, channel),
    address: server.address,
    logs,
    close: async () => {
      channel.close()
      await rt.dispose()
    }
  }
}

/**
 * A client of `address` whose channel retries Generate by gRPC's own retry policy (gRFC A6, as a router's service
 * config would set it): up to `maxAttempts` attempts on the given status codes, 10 ms apart.
 */
export const retryingClient = (
  address: string,
  codes: ReadonlyArray<string>,
  maxAttempts = 3
): { readonly client: AgentClient; close(): void } => {
  const serviceConfig = {
    methodConfig: [
      {
        name: [{ service: "cgn.agent.v1.Agent" }],
        retryPolicy: {
          maxAttempts,
          initialBackoff: "0.01s",
          maxBackoff: "0.01s",
          backoffMultiplier: 1,
          retryableStatusCodes: codes
        }
      }
    ]
  }
  const channel = createChannel(address, undefined, { "grpc.service_config": JSON.stringify(serviceConfig) })
  return { client: createClient(AgentDefinition, channel), close: () => channel.close() }
}

export interface Collected {
  readonly text: string
  readonly deltas: number
  readonly final: GenerateFinal | undefined
  readonly status: string
  readonly details: string
  readonly trailer: Metadata | undefined
}

export const collect = async (client: AgentClient, req: Partial<GenerateRequest>): Promise<Collected> => {
  let text = ""
  let deltas = 0
  let final: GenerateFinal | undefined
  let trailer: Metadata | undefined
  try {
    for await (const r of client.generate(req, { onTrailer: (t) => (trailer = t) })) {
      if (r.delta !== undefined) {
        text += r.delta.text
        deltas++
      }
      if (r.final !== undefined) final = r.final
    }
    return { text, deltas, final, status: "OK", details: "", trailer }
  } catch (e) {
    if (!(e instanceof ClientError)) throw e
    return { text, deltas, final, status: Status[e.code] ?? String(e.code), details: e.details, trailer }
  }
}
