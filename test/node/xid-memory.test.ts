// The Xid memory's record in agent.state_dir (layers/node/xidMemory.ts) over a scripted sampler: a GPU's Xids
// outlive an agent restart within one boot and are forgotten after a reboot; a clear is written; a record that is
// not one, or a state_dir that cannot be written, costs the memory only, said in the log.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Logger, Scope } from "effect"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import type { Gpu, GpuXid } from "../../src/gen/cgn/agent/v1/agent.ts"
import { remembering, xidRecordPath } from "../../src/layers/node/xidMemory.ts"
import type { NvmlSampler, NvmlService } from "../../src/services/node/Nvml.ts"
import { gpuWith } from "../../src/services/node/NvmlValues.ts"
import { pollUntil } from "../support/poll.ts"

const U1 = "GPU-bbbb"
const host = (xids: ReadonlyArray<GpuXid>): ReadonlyArray<Gpu> => [
  gpuWith({ index: 0, uuid: "GPU-aaaa" }),
  gpuWith({ index: 1, uuid: U1, criticalXids: [...xids] })
]

let dir: string
let bootFile: string
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-xid-memory-"))
  bootFile = path.join(dir, "boot_id")
  fs.writeFileSync(bootFile, "boot-1\n")
})
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }))

/** An agent's life: the memory over a sampler answering `sample`, in a scope closed by `stop`; logs collected. */
const start = async (stateDir: string, sample: { current: ReadonlyArray<Gpu> }) => {
  const logs: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => logs.push(`${logLevel} ${[message].flat().join(" ")}`))
  const read = Effect.sync(() => sample.current)
  const sampler: NvmlSampler = { gpus: read, sampleNow: read, unavailable: Effect.succeed(undefined) }
  const scope = await Effect.runPromise(Scope.make())
  const service: NvmlService = await Effect.runPromise(
    remembering(sampler, { stateDir, bootIdFile: bootFile }).pipe(
      Scope.provide(scope),
      Effect.provide(Logger.layer([logger]))
    )
  )
  const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(eff.pipe(Effect.provide(Logger.layer([logger]))))
  return { service, logs, run, stop: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

const recordText = () => fs.readFileSync(xidRecordPath(dir), "utf8")
const xidsOf = (gpus: ReadonlyArray<Gpu>) => gpus.map((g) => g.criticalXids)

describe("the Xid record in state_dir", () => {
  it("a restart within the boot remembers a GPU's Xids; a reboot forgets them", async () => {
    const sample = { current: host([{ xid: 79, events: 1 }]) }
    const first = await start(dir, sample)
    expect(xidsOf(await first.run(first.service.gpus))[1]).toEqual([{ xid: 79, events: 1 }])
    await pollUntil("the record written", () => fs.existsSync(xidRecordPath(dir)) && recordText().includes("79"))
    expect(JSON.parse(recordText())).toEqual({ bootId: "boot-1", gpus: [{ uuid: U1, xids: [{ xid: 79, events: 1 }] }] })
    await first.stop()

    // the agent again, a new NVML session: the GPU's session tallies are empty
    sample.current = host([])
    const second = await start(dir, sample)
    expect(xidsOf(await second.run(second.service.gpus))[1]).toEqual([{ xid: 79, events: 1 }])
    expect(second.logs.join("\n")).toContain("a GPU reported Xids earlier in this boot")
    await second.stop()

    fs.writeFileSync(bootFile, "boot-2\n")
    const rebooted = await start(dir, sample)
    expect(xidsOf(await rebooted.run(rebooted.service.gpus))[1]).toEqual([])
    expect(rebooted.logs.join("\n")).toContain("GPU Xids of an earlier boot forgotten")
    await rebooted.stop()
  })

  it("a new Xid is logged once, on whichever GPU: a fault as a warning with the remedy, an application error at info", async () => {
    const sample = { current: host([]) }
    const agent = await start(dir, sample)
    // the lines' messages, without the fields the test logger prints as [object Object]
    const xidLines = () =>
      agent.logs.filter((l) => l.includes("reported an Xid")).map((l) => l.replace(" [object Object]", ""))
    await agent.run(agent.service.gpus)
    expect(xidLines()).toEqual([])
    // an application error (the engine's own illegal access): said, no fault, no remedy
    sample.current = host([{ xid: 13, events: 1 }])
    await agent.run(agent.service.gpus)
    expect(xidLines()).toEqual(["Info GPU 1 reported an Xid (no fault: the node stays healthy)"])
    // more of it is no new line; a fault Xid is, as a warning
    sample.current = host([
      { xid: 13, events: 3 },
      { xid: 79, events: 1 }
    ])
    await agent.run(agent.service.gpus)
    await agent.run(agent.service.gpus)
    expect(xidLines()).toEqual([
      "Info GPU 1 reported an Xid (no fault: the node stays healthy)",
      "Warn GPU 1 reported an Xid"
    ])
    await agent.stop()
    // the next start says the kept ones with the remedy, as one of them is a fault
    const again = await start(dir, { current: host([]) })
    await again.run(again.service.gpus)
    expect(
      again.logs.filter((l) => l.includes("earlier in this boot")).map((l) => l.replace(" [object Object]", ""))
    ).toEqual(["Warn a GPU reported Xids earlier in this boot (before this agent started)"])
    await again.stop()
  })

  it("a clear is written: the next start does not bring the Xid back", async () => {
    const sample = { current: host([{ xid: 79, events: 1 }]) }
    const first = await start(dir, sample)
    await first.run(first.service.gpus)
    const cleared = await first.run(first.service.clearXids(1))
    expect(cleared).toEqual([{ uuid: U1, index: 1, xids: [{ xid: 79, events: 1 }] }])
    expect(xidsOf(await first.run(first.service.gpus))[1]).toEqual([])
    await pollUntil("the clear written", () => JSON.parse(recordText()).gpus.length === 0)
    await first.stop()
    const second = await start(dir, { current: host([]) })
    expect(xidsOf(await second.run(second.service.gpus))[1]).toEqual([])
    await second.stop()
  })

  it("clearing a GPU the host does not have fails with UnknownGpu", async () => {
    const first = await start(dir, { current: host([]) })
    const failure = await first.run(Effect.flip(first.service.clearXids("GPU-none")))
    expect(failure._tag).toBe("UnknownGpu")
    expect(failure.message).toContain('no GPU "GPU-none" on this host')
    await first.stop()
  })

  it("a record that is not one is said and ignored", async () => {
    fs.writeFileSync(xidRecordPath(dir), "{ not json")
    const first = await start(dir, { current: host([]) })
    expect(xidsOf(await first.run(first.service.gpus))[1]).toEqual([])
    expect(first.logs.join("\n")).toMatch(/the GPU Xid record .* is not one \(not JSON/)
    await first.stop()
  })

  it("a record that is a link is not followed: said, and no byte of its target reaches the log", async () => {
    const secret = path.join(dir, "secret.txt")
    fs.writeFileSync(secret, "TOPSECRET-do-not-log")
    fs.symlinkSync(secret, xidRecordPath(dir))
    const first = await start(dir, { current: host([]) })
    expect(xidsOf(await first.run(first.service.gpus))[1]).toEqual([])
    const logs = first.logs.join("\n")
    expect(logs).toContain(`cannot read the GPU Xid record ${xidRecordPath(dir)}`)
    expect(logs).not.toContain("TOPSECRET")
    await first.stop()
  })

  it("a state_dir that cannot be written is said, the Xids count in memory, and a later change is written", async () => {
    const blocked = path.join(dir, "a-file")
    fs.writeFileSync(blocked, "")
    const stateDir = path.join(blocked, "state")
    const sample = { current: host([{ xid: 79, events: 1 }]) }
    const first = await start(stateDir, sample)
    expect(xidsOf(await first.run(first.service.gpus))[1]).toEqual([{ xid: 79, events: 1 }])
    await pollUntil("the failure said", () => first.logs.some((l) => l.includes("cannot write the GPU Xid record")))
    // the state_dir can be made now: the next Xid writes the whole ledger
    fs.rmSync(blocked)
    sample.current = host([
      { xid: 79, events: 2 },
      { xid: 48, events: 1 }
    ])
    await first.run(first.service.gpus)
    await pollUntil("written again", () => first.logs.some((l) => l.includes("GPU Xid record written again")))
    expect(JSON.parse(fs.readFileSync(xidRecordPath(stateDir), "utf8")).gpus).toEqual([
      {
        uuid: U1,
        xids: [
          { xid: 79, events: 2 },
          { xid: 48, events: 1 }
        ]
      }
    ])
    expect(first.logs.filter((l) => l.includes("cannot write the GPU Xid record"))).toHaveLength(1)
    await first.stop()
  })

  it("a clear the record cannot hold is refused and undone: the Xid stays, as the disk has it", async () => {
    // a state_dir under a file: no write can land there (root ignores modes, so a read-only directory would not do)
    const stateFile = path.join(dir, "a-file")
    fs.writeFileSync(stateFile, "")
    const sample = { current: host([{ xid: 79, events: 1 }]) }
    const blocked = await start(path.join(stateFile, "state"), sample)
    await blocked.run(blocked.service.gpus)
    const failure = await blocked.run(Effect.flip(blocked.service.clearXids(1)))
    expect(failure._tag).toBe("XidRecordError")
    // the record's path, the system's reason, and where to look
    expect(failure.message).toContain(
      `cannot write the GPU Xid record ${xidRecordPath(path.join(stateFile, "state"))}: `
    )
    expect(failure.message).toContain("ENOTDIR")
    expect(failure.message).toMatch(/ \(check agent\.state_dir\)$/)
    expect(xidsOf(await blocked.run(blocked.service.gpus))[1]).toEqual([{ xid: 79, events: 1 }])
    await blocked.stop()
  })

  it("the last change is written when the scope ends, counts included", async () => {
    const sample = { current: host([{ xid: 79, events: 1 }]) }
    const first = await start(dir, sample)
    await first.run(first.service.gpus)
    // counts alone are written at most every 30 s, and the scope ends at once: the flush writes them
    sample.current = host([{ xid: 79, events: 5 }])
    await first.run(first.service.gpus)
    await first.stop()
    expect(JSON.parse(recordText()).gpus).toEqual([{ uuid: U1, xids: [{ xid: 79, events: 5 }] }])
  })
})
