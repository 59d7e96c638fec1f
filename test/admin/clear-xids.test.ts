// POST /gpus/clear-xids over real loopback, on the live Xid memory (layers/node/xidMemory.ts, in memory here) over a
// fixed GPU list: what it clears and answers, the query's refusals, a GPU the host does not have, the method, and
// the admin auth rules. The built agent's restart and clear: test/node/gpu-xid.test.ts.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Result } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { remembering, type XidMemoryOptions, xidRecordPath } from "../../src/layers/node/xidMemory.ts"
import { parseClearXidsQuery } from "../../src/services/admin/ClearXids.ts"
import { type Gpu, Nvml } from "../../src/services/node/Nvml.ts"
import { gpuWith } from "../../src/services/node/NvmlValues.ts"
import { startAdmin } from "../support/admin.ts"

const U0 = "GPU-aaaa"
const U1 = "GPU-bbbb"
const host = [
  gpuWith({ index: 0, uuid: U0, criticalXids: [{ xid: 13, events: 2 }] }),
  gpuWith({ index: 1, uuid: U1, criticalXids: [{ xid: 79, events: 1 }] })
]

const closes: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const close of closes.splice(0)) await close()
})

/** `gpus`: the list NVML gives, or a function that gives each sample's; `memory`: the Xid memory's options. */
const start = async (
  agent: Record<string, unknown> = {},
  gpus: ReadonlyArray<Gpu> | (() => ReadonlyArray<Gpu>) = host,
  memory: XidMemoryOptions = {}
) => {
  const sampled = Effect.sync(() => (typeof gpus === "function" ? gpus() : gpus))
  const nvml = Layer.effect(
    Nvml,
    remembering({ gpus: sampled, sampleNow: sampled, unavailable: Effect.succeed(undefined) }, memory)
  )
  const admin = await startAdmin({ agent, nvml })
  closes.push(admin.close)
  const read = () => Effect.runPromise(Effect.flatMap(Nvml, (n) => n.gpus).pipe(Effect.provideContext(admin.ctx)))
  return { url: `${admin.url}/gpus/clear-xids`, gpus: read }
}

const post = async (url: string, init: RequestInit = {}) => {
  const res = await fetch(url, { method: "POST", ...init })
  return { status: res.status, body: (await res.json()) as Record<string, unknown> }
}

describe("POST /gpus/clear-xids", () => {
  it("clears one GPU by index or UUID, or every GPU, and answers what each had", async () => {
    const { url, gpus } = await start()
    expect(await post(`${url}?gpu=1`)).toEqual({
      status: 200,
      body: { cleared: [{ gpu: 1, uuid: U1, xids: [{ xid: 79, events: 1, name: "Xid 79 (fallen off the bus)" }] }] }
    })
    expect((await gpus()).map((g) => g.criticalXids.length)).toEqual([1, 0])
    // nothing left on GPU 1: cleared again, nothing listed
    expect(await post(`${url}?gpu=${U1}`)).toEqual({ status: 200, body: { cleared: [] } })
    expect((await post(url)).body).toEqual({
      cleared: [{ gpu: 0, uuid: U0, xids: [{ xid: 13, events: 2, name: "Xid 13 (graphics engine exception)" }] }]
    })
    expect((await gpus()).map((g) => g.criticalXids.length)).toEqual([0, 0])
  })

  it("a GPU the host does not have is 404; a query that is not one is 400; another method is 405", async () => {
    const { url } = await start()
    expect(await post(`${url}?gpu=7`)).toEqual({
      status: 404,
      body: { error: "no GPU 7 on this host (neither listed by NVML nor with Xids remembered)" }
    })
    expect((await post(`${url}?gpus=1`)).status).toBe(400)
    expect((await post(`${url}?gpu=one`)).status).toBe(400)
    const get = await fetch(url)
    expect(get.status).toBe(405)
    expect(get.headers.get("allow")).toBe("POST, OPTIONS")
  })

  it("a GPU that cannot be named by UUID now is 409 with why; a remembered one is still cleared by UUID", async () => {
    const { url } = await start({}, [gpuWith({ index: 0, uuid: "", unreportedFields: ["uuid"] })])
    expect(await post(`${url}?gpu=0`)).toEqual({
      status: 409,
      body: { error: "GPU 0 cannot be told by its UUID: NVML cannot read its UUID now; try again" }
    })
    const down = await start({}, [])
    expect((await post(`${down.url}?gpu=0`)).body).toEqual({
      error: "GPU 0 cannot be told by its UUID: NVML lists no GPUs now; give the GPU's UUID"
    })
    // A UUID it does not remember is not on this host: 404, not "give the GPU's UUID" to a request that gave one.
    expect(await post(`${down.url}?gpu=GPU-00000000-0000-0000-0000-000000000009`)).toEqual({
      status: 404,
      body: {
        error:
          'no GPU "GPU-00000000-0000-0000-0000-000000000009" on this host (neither listed by NVML nor with Xids remembered)'
      }
    })
  })

  it("a clear the record in state_dir cannot hold is 500 with why, and nothing is cleared", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "clear-xids-"))
    const bootIdFile = path.join(dir, "boot_id")
    fs.writeFileSync(bootIdFile, "boot-1\n")
    // a state_dir under a file: no write can land there (root ignores modes, so a read-only directory would not do)
    fs.writeFileSync(path.join(dir, "a-file"), "")
    const stateDir = path.join(dir, "a-file", "state")
    const { url, gpus } = await start({}, host, { stateDir, bootIdFile })
    // after the admin server's close, whose last flush of the record would make the state_dir again
    closes.push(async () => fs.rmSync(dir, { recursive: true, force: true }))
    const answer = await post(`${url}?gpu=1`)
    expect(answer.status).toBe(500)
    // the record's path, the system's reason, where to look, and that nothing was done
    const error = String(answer.body.error)
    expect(error.startsWith(`cannot write the GPU Xid record ${xidRecordPath(stateDir)}: `)).toBe(true)
    expect(error).toContain("ENOTDIR")
    expect(error.endsWith(" (check agent.state_dir); nothing was cleared")).toBe(true)
    expect((await gpus()).map((g) => g.criticalXids.length)).toEqual([1, 1])
  })

  it("a GPU NVML no longer lists but whose Xids are remembered is cleared by UUID, answered with gpu null", async () => {
    // GPU 1 reports Xid 79 (fallen off the bus), then NVML lists GPU 0 only
    let listed: ReadonlyArray<Gpu> = host
    const { url, gpus } = await start({}, () => listed)
    await gpus()
    listed = [host[0]!]
    expect(await post(`${url}?gpu=${U1}`)).toEqual({
      status: 200,
      body: { cleared: [{ gpu: null, uuid: U1, xids: [{ xid: 79, events: 1, name: "Xid 79 (fallen off the bus)" }] }] }
    })
  })

  it("needs the admin token when one is set", async () => {
    const { url, gpus } = await start({ admin_token: "s3cret" })
    expect((await post(url)).status).toBe(401)
    expect((await gpus()).map((g) => g.criticalXids.length)).toEqual([1, 1])
    expect((await post(url, { headers: { authorization: "Bearer s3cret" } })).status).toBe(200)
  })
})

describe("the query (pure)", () => {
  it("an index, a UUID, or nothing for every GPU; anything else says why", () => {
    expect(parseClearXidsQuery("")).toEqual(Result.succeed(undefined))
    expect(parseClearXidsQuery("?gpu=3")).toEqual(Result.succeed(3))
    expect(parseClearXidsQuery("?gpu=GPU-1b2c-3d")).toEqual(Result.succeed("GPU-1b2c-3d"))
    expect(parseClearXidsQuery("?gpu=MIG-1b2c-3d")).toEqual(
      Result.fail("a MIG instance's Xids are its GPU's: give the GPU's index or UUID")
    )
    expect(parseClearXidsQuery("?gpu=1&gpu=2")).toEqual(Result.fail("gpu given 2 times; give it once"))
    expect(parseClearXidsQuery("?gpu=-1")).toEqual(
      Result.fail('gpu must be an NVML index or a GPU UUID (GPU-...), got "-1"')
    )
    expect(parseClearXidsQuery("?all=1")).toEqual(Result.fail('unknown parameter "all"; the one known is gpu'))
  })

  it("an index is 1 to 4 digits; a UUID is GPU- and 1 to 80 more characters, from the start; an empty gpu is refused", () => {
    // an unset variable in a script (`?gpu=$GPU`) must not clear GPU 0
    expect(parseClearXidsQuery("?gpu=")).toEqual(
      Result.fail('gpu must be an NVML index or a GPU UUID (GPU-...), got ""')
    )
    expect(parseClearXidsQuery("?gpu=0")).toEqual(Result.succeed(0))
    expect(parseClearXidsQuery("?gpu=1000")).toEqual(Result.succeed(1000))
    expect(parseClearXidsQuery("?gpu=9999")).toEqual(Result.succeed(9999))
    expect(parseClearXidsQuery("?gpu=10000")).toEqual(
      Result.fail('gpu must be an NVML index or a GPU UUID (GPU-...), got "10000"')
    )
    expect(parseClearXidsQuery("?gpu=GPU-")).toEqual(
      Result.fail('gpu must be an NVML index or a GPU UUID (GPU-...), got "GPU-"')
    )
    expect(parseClearXidsQuery("?gpu=xGPU-1")).toEqual(
      Result.fail('gpu must be an NVML index or a GPU UUID (GPU-...), got "xGPU-1"')
    )
    const longest = `GPU-${"a".repeat(80)}`
    expect(parseClearXidsQuery(`?gpu=${longest}`)).toEqual(Result.succeed(longest))
    expect(Result.isFailure(parseClearXidsQuery(`?gpu=${longest}a`))).toBe(true)
  })
})
