// An NVML Binding (src/layers/node/nvmlBinding.ts) faked in JS, for what the C fake cannot script: entry points
// missing from the driver, a GPU lost half-way through its queries, a call that throws out of the FFI, and the
// event set's calls as the worker makes them (the timeout of each wait).
import type { Binding } from "../../src/layers/node/nvmlBinding.ts"

export interface FakeGpu {
  readonly uuid: string
  /** Return code per entry point (by Binding key, or an event-set call by its EventBinding key); absent: success. */
  readonly rc?: Partial<Record<keyof Binding | "supported" | "register" | "create" | "wait", number>>
  /** Entry points that throw, as koffi does on a value it cannot convert. */
  readonly throws?: ReadonlyArray<keyof Binding>
  /** nvmlDeviceGetRemappedRows' isPending and failureOccurred. */
  readonly remap?: { readonly pending?: boolean; readonly failure?: boolean }
  /** nvmlDeviceGetRetiredPagesPendingStatus' isPending (dynamic page retirement, boards before Ampere). */
  readonly retiredPagesPending?: boolean
  /** nvmlDeviceGetSupportedEventTypes' mask (default 0x1f: Xid critical errors, 0x8, among them). */
  readonly eventTypes?: bigint
  /**
   * Its events carry a device address other than its handle's (ALIAS + index), which nvmlDeviceGetIndex still
   * names: only NVML's index attributes them.
   */
  readonly eventAlias?: boolean
}

/** Where an aliased GPU's event device addresses start (eventAlias). */
export const ALIAS = 100
/** The device address of an event NVML cannot name (queued as GPU -1): no handle has it, nvmlDeviceGetIndex fails. */
export const STRANGER = 0xdead

/**
 * The event side of the fake: Xids to deliver (GPU index, Xid; index -1: a device NVML cannot name, delivered while
 * any GPU is registered) and the timeout of every wait made.
 */
export interface FakeEvents {
  readonly queue: Array<readonly [number, number]>
  readonly waits: Array<number>
  /** Sets created and freed, in order. */
  readonly log: Array<string>
}

export const fakeEvents = (): FakeEvents => ({ queue: [], waits: [], log: [] })

// Device handles are GPU indices, and their address is the index too.
export const fakeBinding = (gpus: ReadonlyArray<FakeGpu>, events: FakeEvents = fakeEvents()): Binding => {
  const answer = (key: keyof Binding | "supported" | "register", device: unknown, fill: () => void): number => {
    const g = gpus[device as number]
    if (g === undefined) return 2
    if (g.throws?.includes(key as keyof Binding)) throw new TypeError(`${String(key)}: unexpected value`)
    const rc = g.rc?.[key] ?? 0
    if (rc === 0) fill()
    return rc
  }
  const put = (buf: Uint8Array, text: string) => buf.set(new TextEncoder().encode(`${text}\0`))
  const registered = new Set<number>()
  return {
    init: () => 0,
    shutdown: () => 0,
    count: (out) => {
      out[0] = gpus.length
      return 0
    },
    handle: (index, out) =>
      answer("handle", index, () => {
        out[0] = index
      }),
    name: (d, buf) => answer("name", d, () => put(buf, "Fake GPU")),
    uuid: (d, buf) => answer("uuid", d, () => put(buf, gpus[d as number]?.uuid ?? "")),
    memory: (d, out) =>
      answer("memory", d, () => Object.assign(out, { total: 80n * 2n ** 30n, used: 2n ** 30n, free: 79n * 2n ** 30n })),
    utilization: (d, out) => answer("utilization", d, () => Object.assign(out, { gpu: 40, memory: 20 })),
    temperature: (d, _sensor, out) =>
      answer("temperature", d, () => {
        out[0] = 60
      }),
    power: (d, out) =>
      answer("power", d, () => {
        out[0] = 250_000
      }),
    powerLimit: (d, out) =>
      answer("powerLimit", d, () => {
        out[0] = 700_000
      }),
    throttle: (d, out) =>
      answer("throttle", d, () => {
        out[0] = 0n
      }),
    ecc: (d, _type, _counter, out) =>
      answer("ecc", d, () => {
        out[0] = 0n
      }),
    processes: (d, count) =>
      answer("processes", d, () => {
        count[0] = 0
      }),
    remappedRows: (d, _corrected, _uncorrected, pending, failure) =>
      answer("remappedRows", d, () => {
        const remap = gpus[d as number]?.remap
        pending[0] = remap?.pending === true ? 1 : 0
        failure[0] = remap?.failure === true ? 1 : 0
      }),
    retiredPagesPending: (d, isPending) =>
      answer("retiredPagesPending", d, () => {
        isPending[0] = gpus[d as number]?.retiredPagesPending === true ? 1 : 0
      }),
    events: {
      create: (out) => {
        events.log.push("create")
        out[0] = "set"
        return gpus[0]?.rc?.create ?? 0
      },
      supported: (d, out) =>
        answer("supported", d, () => {
          out[0] = gpus[d as number]?.eventTypes ?? 0x1fn
        }),
      register: (d, types, set) =>
        answer("register", d, () => {
          if (set !== "set" || types !== 0x8n) throw new Error(`register(${String(d)}, ${types}, ${String(set)})`)
          registered.add(d as number)
        }),
      wait: (set, data, timeoutMs) => {
        events.waits.push(timeoutMs)
        const failed = gpus[0]?.rc?.wait
        if (failed !== undefined) return failed
        // as NVML: events of GPUs not registered on the set are not delivered
        const delivered = (gpu: number) => (gpu === -1 ? registered.size > 0 : registered.has(gpu))
        let next = events.queue.shift()
        while (next !== undefined && !delivered(next[0])) next = events.queue.shift()
        if (set !== "set" || next === undefined) return 10 // NVML_ERROR_TIMEOUT
        const [gpu, xid] = next
        const device = gpu === -1 ? STRANGER : gpus[gpu]?.eventAlias === true ? ALIAS + gpu : gpu
        Object.assign(data, { device, eventType: 0x8n, eventData: BigInt(xid) })
        return 0
      },
      free: () => {
        events.log.push("free")
        return 0
      },
      address: (d) => BigInt(d as number),
      // nvmlDeviceGetIndex: a handle (its index) or an aliased GPU's event address; INVALID_ARGUMENT otherwise
      index: (address, out) => {
        const n = Number(address)
        const gpu = n >= ALIAS && gpus[n - ALIAS]?.eventAlias === true ? n - ALIAS : n
        if (gpus[gpu] === undefined) return 2
        out[0] = gpu
        return 0
      }
    },
    unload: () => undefined
  }
}
