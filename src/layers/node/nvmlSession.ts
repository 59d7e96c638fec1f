/**
 * The NVML worker thread's side of the conversation (programs/nvmlWorker.ts is the message loop around it): one
 * NVML session at most, with its Xid event set (nvmlEvents.ts), and one reply per request. The main thread
 * (layers/node/Nvml.ts) keeps every policy: backoff, deadlines, logging, caching. Free of `effect`, as everything the
 * worker loads.
 */
import type { Gpu } from "../../gen/cgn/agent/v1/agent.ts"
import { NvmlAbsence } from "../../services/node/NvmlAbsence.ts"
import { nvmlReturnName } from "../../services/node/NvmlValues.ts"
import { type Binding, bind } from "./nvmlBinding.ts"
import { type XidWatch, xidWatch } from "./nvmlEvents.ts"
import { sample } from "./nvmlSample.ts"

type Koffi = typeof import("koffi")["default"]

/** What the main thread asks; the worker answers each with the NvmlReply of the same `op`. */
export type NvmlRequest =
  | { readonly op: "open"; readonly library: string }
  | { readonly op: "sample" }
  | { readonly op: "close" }

export type NvmlReply =
  /** `failed`: why the library could not be bound or nvmlInit_v2 failed (the worker holds no session then). */
  | { readonly op: "open"; readonly failed: string | undefined }
  /** `gone`: NVML itself answers no more (the device count refused); the worker has shut it down. */
  | {
      readonly op: "sample"
      readonly gpus: ReadonlyArray<Gpu>
      readonly problems: ReadonlyArray<string>
      readonly gone: string | undefined
    }
  | { readonly op: "close" }

const message = (e: unknown) => (e instanceof Error ? e.message : String(e))

/** The request handler of one worker: binds and inits on "open", samples, shuts NVML down on "close". */
export const nvmlSession = (koffi: Koffi): ((request: NvmlRequest) => NvmlReply) => {
  let nvml: Binding | undefined
  /** The Xid events of this NVML session (a new session starts with none: its event set is new). */
  let xids: XidWatch | undefined
  const close = () => {
    try {
      xids?.free()
    } catch {
      // a driver that throws here must not keep NVML from being shut down
    }
    xids = undefined
    nvml?.shutdown()
    nvml?.unload()
    nvml = undefined
  }
  return (request) => {
    switch (request.op) {
      case "open": {
        close()
        let next: Binding
        try {
          next = bind(koffi, request.library)
        } catch (e) {
          return { op: "open", failed: NvmlAbsence.cannotLoad(request.library, message(e)) }
        }
        const rc = next.init()
        if (rc !== 0) {
          next.unload()
          return { op: "open", failed: `nvmlInit_v2 failed: ${nvmlReturnName(rc)}` }
        }
        nvml = next
        xids = xidWatch(next)
        return { op: "open", failed: undefined }
      }
      case "sample": {
        if (nvml === undefined) return { op: "sample", gpus: [], problems: [], gone: "NVML is not open" }
        const problems = new Set<string>()
        let gone: string | undefined
        const gpus = sample(
          nvml,
          problems,
          (why) => {
            gone = why
          },
          xids
        )
        // NVML answers no more: shut it down here, where it lives (the main thread opens it again later).
        if (gone !== undefined) close()
        return { op: "sample", gpus: gone === undefined ? gpus : [], problems: [...problems], gone }
      }
      case "close":
        close()
        return { op: "close" }
    }
  }
}
