// Xid events, row remapping and page retirement through the real FFI: the fake libnvidia-ml.so
// (test/fixtures/fake_nvml.c) delivers the lines of FAKE_NVML_XID_FILE as nvmlEventSetWait_v2 events and scripts
// nvmlDeviceGetRemappedRows and nvmlDeviceGetRetiredPagesPendingStatus per GPU (FAKE_NVML_STATE). The worker's
// session (layers/node/nvmlSession.ts) takes each event once, never waits with a timeout, leaves what a board or
// driver lacks unreported, tells each event's GPU by nvmlDeviceGetIndex (else by its handle's address; else every
// watched GPU's, fail closed); the live layer's /metrics page carries the Xid counter, the row-remapping and the
// page-retirement gauges, and passes promtool; a GPU NVML no longer lists keeps its Xids there, by its last index.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import koffi from "koffi"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import * as NvmlLive from "../../src/layers/node/Nvml.ts"
import { type NvmlReply, nvmlSession } from "../../src/layers/node/nvmlSession.ts"
import { nvmlWorkerEntry } from "../../src/programs/programPaths.ts"
import { type Gpu, Nvml } from "../../src/services/node/Nvml.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { buildFakeNvml } from "../support/nvml.ts"

const PROMTOOL = process.env.PROMTOOL ?? "promtool"
const G0 = 'gpu="0",uuid="GPU-00000000-1111-2222-3333-444444444444"'
const G1 = 'gpu="1",uuid="GPU-55555555-6666-7777-8888-999999999999"'
const KNOBS = [
  "FAKE_NVML_XID_FILE",
  "FAKE_NVML_WAIT_LOG",
  "FAKE_NVML_STATE",
  "FAKE_NVML_SHUTDOWN_FILE",
  "FAKE_NVML_COUNT_RC"
]

let dir = ""
let library = ""
let bare = ""
let noIndex = ""

beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-nvml-xid-"))
  library = buildFakeNvml(dir)
  bare = buildFakeNvml(dir, ["FAKE_NVML_NO_EVENTS", "FAKE_NVML_NO_REMAP", "FAKE_NVML_NO_PAGE_RETIREMENT"])
  noIndex = buildFakeNvml(dir, ["FAKE_NVML_NO_INDEX"])
})
afterEach(() => {
  for (const k of KNOBS) delete process.env[k]
})
afterAll(() => {
  if (dir) fs.rmSync(dir, { recursive: true, force: true })
})

/** Files for the fake's knobs, named after the test; the Xid file starts empty. */
const knobs = (name: string) => {
  const file = (suffix: string) => path.join(dir, `${name}.${suffix}`)
  const xids = file("xid")
  const state = file("state")
  fs.writeFileSync(xids, "")
  fs.writeFileSync(state, "")
  process.env.FAKE_NVML_XID_FILE = xids
  process.env.FAKE_NVML_WAIT_LOG = file("waits")
  process.env.FAKE_NVML_STATE = state
  process.env.FAKE_NVML_SHUTDOWN_FILE = file("shutdown")
  return {
    xid: (...lines: ReadonlyArray<string>) => fs.appendFileSync(xids, lines.map((l) => `${l}\n`).join("")),
    state: (...lines: ReadonlyArray<string>) => fs.writeFileSync(state, lines.map((l) => `${l}\n`).join("")),
    waits: () => fs.readFileSync(file("waits"), "utf8").trim().split("\n"),
    shutdown: () => fs.readFileSync(file("shutdown"), "utf8")
  }
}

/** The worker's side, in this thread: open `lib`, then a sample per call. */
const openSession = (lib: string) => {
  const answer = nvmlSession(koffi)
  expect(answer({ op: "open", library: lib })).toEqual({ op: "open", failed: undefined })
  return {
    sample: () => answer({ op: "sample" }) as Extract<NvmlReply, { op: "sample" }>,
    close: () => answer({ op: "close" })
  }
}

const gpusOf = (reply: { readonly gpus: ReadonlyArray<Gpu> }) =>
  reply.gpus.map((g) => ({
    xids: g.criticalXids,
    pending: g.rowRemapPending,
    failure: g.rowRemapFailure,
    pages: g.retiredPagesPending,
    unreported: g.unreportedFields
  }))

describe("Xid events, row remapping and page retirement through the FFI", () => {
  it("takes each Xid once, with waits of timeout 0 only; reads remapping and page retirement; frees the set before shutdown", () => {
    const k = knobs("once")
    const s = openSession(library)
    const none = { xids: [], pending: false, failure: false, pages: false, unreported: [] }
    expect(gpusOf(s.sample())).toEqual([none, none])
    k.xid("1 79")
    expect(gpusOf(s.sample())[1]?.xids).toEqual([{ xid: 79, events: 1 }])
    expect(gpusOf(s.sample())[1]?.xids).toEqual([{ xid: 79, events: 1 }]) // taken once
    k.xid("1 79", "0 13")
    k.state("gpu.0.remap_pending=1", "gpu.1.remap_failure=1", "gpu.1.pages_pending=1")
    const reply = s.sample()
    expect(reply.problems).toEqual([])
    expect(gpusOf(reply)).toEqual([
      { ...none, xids: [{ xid: 13, events: 1 }], pending: true },
      { ...none, xids: [{ xid: 79, events: 2 }], failure: true, pages: true }
    ])
    // the GPU then falls off the bus: lost, with the Xid that says so
    k.state("gpu.1.lost=1")
    expect(s.sample().gpus[1]).toMatchObject({ lost: true, criticalXids: [{ xid: 79, events: 2 }] })
    s.close()
    expect(new Set(k.waits())).toEqual(new Set(["wait 0"]))
    expect(k.shutdown()).toBe("event_set_free\nshutdown\n")
  })

  it("a GPU without the Xid event type, row remapping or page retirement has them unreported, silently; no Xid delivered", () => {
    const k = knobs("unsupported")
    // GPU 0 as a V100 (page retirement, no row remapping), GPU 1 as an A100 (the other way round: NOT_SUPPORTED)
    k.state("gpu.1.events=0x3", "gpu.0.remap_rc=3", "gpu.1.pages_rc=3")
    k.xid("1 79", "0 48")
    const s = openSession(library)
    const reply = s.sample()
    s.close()
    expect(reply.problems).toEqual([])
    expect(gpusOf(reply)).toEqual([
      {
        xids: [{ xid: 48, events: 1 }],
        pending: false,
        failure: false,
        pages: false,
        unreported: ["row_remap_pending", "row_remap_failure"]
      },
      { xids: [], pending: false, failure: false, pages: false, unreported: ["critical_xids", "retired_pages_pending"] }
    ])
  })

  it("a driver without the event-set entry points, remapped rows and retired pages reports them unknown, silently", () => {
    const k = knobs("bare")
    k.xid("0 79")
    const s = openSession(bare)
    const reply = s.sample()
    s.close()
    expect(reply.problems).toEqual([])
    const unknown = {
      xids: [],
      pending: false,
      failure: false,
      pages: false,
      unreported: ["critical_xids", "row_remap_pending", "row_remap_failure", "retired_pages_pending"]
    }
    expect(gpusOf(reply)).toEqual([unknown, unknown])
    expect(k.shutdown()).toBe("shutdown\n") // no set to free
  })

  it("an event is the GPU nvmlDeviceGetIndex names; one NVML cannot name counts against every watched GPU, said", () => {
    const k = knobs("attribution")
    const s = openSession(library)
    s.sample()
    // the event's device is not GPU 1's handle, and NVML's index still names GPU 1
    k.xid("1 79 alias")
    const named = s.sample()
    expect(named.problems).toEqual([])
    expect(named.gpus.map((g) => g.criticalXids)).toEqual([[], [{ xid: 79, events: 1 }]])
    k.xid("-1 48")
    const unnamed = s.sample()
    s.close()
    expect(unnamed.gpus.map((g) => g.criticalXids)).toEqual([
      [{ xid: 48, events: 1 }],
      [
        { xid: 79, events: 1 },
        { xid: 48, events: 1 }
      ]
    ])
    expect(unnamed.problems).toEqual([
      "an Xid event's GPU cannot be told (nvmlDeviceGetIndex: NVML_ERROR_INVALID_ARGUMENT (2); its device is no watched GPU's handle): it counts against every watched GPU"
    ])
  })

  it("a driver without nvmlDeviceGetIndex: the handle's address tells the GPU, and an event no handle has fails closed", () => {
    const k = knobs("no-index")
    k.xid("0 13", "1 79 alias")
    const s = openSession(noIndex)
    // the pass registers each GPU, then takes the pending events
    const reply = s.sample()
    s.close()
    expect(reply.gpus.map((g) => g.criticalXids)).toEqual([
      [
        { xid: 13, events: 1 },
        { xid: 79, events: 1 }
      ],
      [{ xid: 79, events: 1 }]
    ])
    expect(reply.problems).toEqual([
      "an Xid event's GPU cannot be told (nvmlDeviceGetIndex missing from the driver; its device is no watched GPU's handle): it counts against every watched GPU"
    ])
  })

  it("the live layer's page carries the Xid counter, the remapping and page-retirement gauges, and passes promtool", async () => {
    const k = knobs("metrics")
    k.xid("0 79", "0 13", "0 79")
    k.state(
      "gpu.1.remap_pending=1",
      "gpu.1.events=0x3",
      "gpu.0.remap_rc=3",
      "gpu.0.pages_pending=1",
      "gpu.1.pages_rc=3"
    )
    const body = await Effect.runPromise(
      Effect.gen(function* () {
        yield* (yield* Nvml).gpus
        yield* (yield* Metrics).render
        // a second scrape: the counter mirrors the session's totals, it does not add them up again
        return (yield* (yield* Metrics).render).body
      }).pipe(
        // the operator's rule turned round (engine.ignore_xids = [79], fault_xids = [13]): the fault label follows it
        Effect.provide(
          NvmlLive.layer(nvmlWorkerEntry(), { library, xidRule: { ignore: [79], fault: [13] } }).pipe(
            Layer.provideMerge(MetricsTest.layerTest)
          )
        )
      )
    )
    const lines = body.split("\n").filter((l) => /^cgn_agent_gpu_(xid|row_remap|retired_pages)/.test(l))
    expect(lines.sort()).toEqual(
      [
        `cgn_agent_gpu_xid_errors_total{${G0},xid="79",fault="false"} 2`,
        `cgn_agent_gpu_xid_errors_total{${G0},xid="13",fault="true"} 1`,
        // GPU 0 cannot report row remapping, GPU 1 cannot deliver Xids nor report page retirement: no series for
        // either, not a 0
        `cgn_agent_gpu_row_remap_pending{${G1}} 1`,
        `cgn_agent_gpu_row_remap_failure{${G1}} 0`,
        `cgn_agent_gpu_retired_pages_pending{${G0}} 1`
      ].sort()
    )
    const r = spawnSync(PROMTOOL, ["check", "metrics"], { input: body, encoding: "utf8" })
    if (r.error !== undefined) throw new Error(`${PROMTOOL} not found: install it, e.g. apt-get install prometheus`)
    expect(`${r.stdout}${r.stderr}`).toBe("")
    expect(r.status).toBe(0)
  })
  it("the Xids of a GPU NVML no longer lists stay on the page, labelled with the index it last had", async () => {
    const k = knobs("unlisted")
    k.xid("1 79")
    const page = await Effect.runPromise(
      Effect.gen(function* () {
        const nvml = yield* Nvml
        const metrics = yield* Metrics
        expect((yield* nvml.sampleNow)[1]?.criticalXids).toEqual([expect.objectContaining({ xid: 79, events: 1 })])
        // a scrape while NVML lists the GPU (the page learns its index as it renders)
        expect((yield* metrics.render).body).toContain(`cgn_agent_gpu_xid_errors_total{${G1},xid="79",fault="true"} 1`)
        // NVML stops answering (a GPU off the bus hangs it; here its device count fails): it lists no GPU now
        process.env.FAKE_NVML_COUNT_RC = "999"
        expect(yield* nvml.sampleNow).toEqual([])
        return (yield* metrics.render).body
      }).pipe(
        Effect.provide(
          NvmlLive.layer(nvmlWorkerEntry(), { library, maxAge: 0 }).pipe(Layer.provideMerge(MetricsTest.layerTest))
        )
      )
    )
    expect(page).toContain("cgn_agent_nvml_up 0")
    expect(page).toContain(`cgn_agent_gpu_xid_errors_total{${G1},xid="79",fault="true"} 1`)
  })
})
