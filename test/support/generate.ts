// A gRPC client for a running agent and one Generate call run to its end, collecting deltas, the final
// message and the error. Shared by the end-to-end and the real-engine suites.
import { type Channel, ClientError, createChannel, createClient, Status } from "nice-grpc"
import {
  type AgentClient,
  AgentDefinition,
  type GenerateDelta,
  type GenerateFinal
} from "../../src/gen/cgn/agent/v1/agent.ts"

/** A channel and an Agent client for `address`; the caller closes the channel (keep it in a list). */
export const agentClient = (address: string): { client: AgentClient; channel: Channel } => {
  const channel = createChannel(address)
  return { client: createClient(AgentDefinition, channel), channel }
}

export interface Collected {
  readonly deltas: Array<GenerateDelta>
  final: GenerateFinal | undefined
  error: unknown
  readonly tokens: () => number
  readonly text: () => string
}

/** Runs one Generate to its end; `firstDelta` resolves on the first delta (to act mid-stream). */
export const generate = (
  client: AgentClient,
  req: Parameters<AgentClient["generate"]>[0],
  options?: Parameters<AgentClient["generate"]>[1]
) => {
  const out: Collected = {
    deltas: [],
    final: undefined,
    error: undefined,
    tokens: () => out.deltas.reduce((n, d) => n + d.tokens, 0),
    text: () => out.deltas.map((d) => d.text).join("")
  }
  let onFirst: () => void = () => {}
  const firstDelta = new Promise<void>((resolve) => {
    onFirst = resolve
  })
  const done = (async () => {
    try {
      for await (const ev of client.generate(req, options)) {
        if (ev.delta !== undefined) {
          out.deltas.push(ev.delta)
          onFirst()
        }
        if (ev.final !== undefined) out.final = ev.final
      }
    } catch (e) {
      out.error = e
    }
    onFirst()
    return out
  })()
  return { out, firstDelta, done }
}

/** The gRPC status name of an error (`"INVALID_ARGUMENT"`), undefined for anything else. */
export const grpcCode = (e: unknown): string | undefined => (e instanceof ClientError ? Status[e.code] : undefined)
