/**
 * SGLang's prefill/decode rendezvous, pure: the three values (host, port, room) the router puts in both legs, checked
 * as the decode engine will use them, and a leg's body with them. Upstream: SGLang's bootstrap fields
 * (python/sglang/srt/entrypoints/openai/protocol.py: bootstrap_host, bootstrap_port, bootstrap_room). Handoff.ts
 * turns the problems found here into its InvalidHandoff, as it does NixlParams.ts's for vLLM.
 */
import type { JsonObject } from "../engine/EngineClient.ts"
import { exactIntegerJson } from "./ExactInteger.ts"
import { isHostOrIp } from "./NixlParams.ts"
import { quoteInput } from "./StatusMessage.ts"

/** As it arrives (proto SglangBootstrap, JSON, CLI). */
export interface BootstrapInput {
  readonly host: string
  readonly port: number
  readonly room: number | bigint | string
}

export interface Bootstrap {
  readonly host: string
  readonly port: number
  readonly room: bigint
}

export const MAX_BOOTSTRAP_ROOM = 2n ** 63n - 1n

const toRoom = (room: number | bigint | string): bigint | undefined => {
  if (typeof room === "bigint") return room
  if (typeof room === "number") return Number.isSafeInteger(room) ? BigInt(room) : undefined
  return /^\d+$/.test(room) ? BigInt(room) : undefined
}

/**
 * Where the decode engine reaches the prefill engine's bootstrap server: a host name or an IP literal, IPv6 bare or
 * in brackets. SGLang dials `http://{bootstrap_host}:{bootstrap_port}/route` (python/sglang/srt/disaggregation/
 * common/conn.py, CommonKVReceiver) and logs the address: anything else (CR/LF, an escape sequence, a path) from a
 * hostile or broken router reached the decode engine. The agent publishes the host bare (NodeHealth `bootstrap`);
 * a router that copied it from a URL may bracket an IPv6 one.
 */
const isBootstrapHost = (host: string): boolean => {
  const inner = /^\[(.*)\]$/.exec(host)?.[1]
  return inner === undefined ? isHostOrIp(host) : inner.includes(":") && isHostOrIp(inner)
}

/**
 * Host a host name or IP literal, port 1..65535, room an exact integer in [0, 2^63-1] (a float above 2^53 is not
 * exact): the rendezvous, or the fields absent (`missing`: an empty host, port 0, proto's unset) and the values wrong
 * (`problems`, each said with the value).
 */
export const checkBootstrap = (
  input: BootstrapInput
):
  | { readonly _tag: "Bootstrap"; readonly bootstrap: Bootstrap }
  | {
      readonly _tag: "Problems"
      readonly problems: ReadonlyArray<string>
      readonly missing: ReadonlyArray<string>
    } => {
  const problems: Array<string> = []
  const missing: Array<string> = []
  if (input.host.trim() === "") missing.push("bootstrap.host")
  else if (!isBootstrapHost(input.host)) {
    problems.push(`bootstrap.host must be a host name or IP address, got ${quoteInput(input.host, 40)}`)
  }
  if (input.port === 0) missing.push("bootstrap.port")
  else if (!Number.isInteger(input.port) || input.port < 1 || input.port > 65535) {
    problems.push(`bootstrap.port must be in 1..65535, got ${input.port}`)
  }
  const room = toRoom(input.room)
  if (room === undefined || room < 0n || room > MAX_BOOTSTRAP_ROOM) {
    problems.push(`bootstrap.room must be an exact integer in [0, 2^63-1], got ${String(input.room)}`)
  }
  return problems.length > 0 || missing.length > 0 || room === undefined
    ? { _tag: "Problems", problems, missing }
    : { _tag: "Bootstrap", bootstrap: { host: input.host, port: input.port, room } }
}

/**
 * Either leg's body: the client's body with the rendezvous fields. The prefill leg is sent whole (the agent
 * only waits for P to finish; the answer comes from D), the decode leg streamed.
 */
export const bootstrapLegBody = (body: JsonObject, bootstrap: Bootstrap): JsonObject => ({
  ...body,
  bootstrap_host: bootstrap.host,
  bootstrap_port: bootstrap.port,
  // a room above 2^53 stays exact
  bootstrap_room: exactIntegerJson(bootstrap.room)
})
