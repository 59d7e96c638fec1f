// POST /debug/cpu-profile over real loopback, profiling this test process's own main thread through the real
// inspector: the .cpuprofile answer, one profile at a time, the query's refusals, the admin auth rules, and the
// inspector session released (profiler off, session disconnected) when the client goes away or the server
// stops mid-profile. Session.prototype is spied on to see which protocol calls each session got: V8 keeps a
// profiler per session, so another session starting one would say nothing about a session left recording.
import { Session } from "node:inspector/promises"
import { Result } from "effect"
import { afterEach, describe, expect, it, type MockInstance, vi } from "vitest"
import { cpuProfileFileName, parseCpuProfileQuery } from "../../src/services/admin/CpuProfile.ts"
import { startAdmin } from "../support/admin.ts"

const realPost = Session.prototype.post
let close: (() => Promise<void>) | undefined
let post: MockInstance<Session["post"]>
let disconnect: MockInstance<Session["disconnect"]>
afterEach(async () => {
  await close?.()
  close = undefined
  vi.restoreAllMocks()
})

const start = async (agent: Record<string, unknown> = {}) => {
  post = vi.spyOn(Session.prototype, "post")
  disconnect = vi.spyOn(Session.prototype, "disconnect")
  const admin = await startAdmin({ agent: { node_id: "node-a", ...agent } })
  close = admin.close
  return `${admin.url}/debug/cpu-profile`
}

/** The inspector methods each session was sent, in order, and whether it was disconnected. */
const sessions = () => {
  const seen = new Map<unknown, { methods: Array<string>; disconnected: boolean }>()
  const of = (s: unknown) => seen.get(s) ?? seen.set(s, { methods: [], disconnected: false }).get(s)!
  for (const [i, [method]] of post.mock.calls.entries()) of(post.mock.contexts[i]).methods.push(method)
  for (const s of disconnect.mock.contexts) of(s).disconnected = true
  return [...seen.values()].filter((s) => s.methods.includes("Profiler.start"))
}

/** Polls `ready` every 10 ms until it holds; fails after `ms`. */
const until = async (what: string, ms: number, ready: () => boolean) => {
  const deadline = performance.now() + ms
  while (!ready()) {
    if (performance.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 10))
  }
}
const recording = () => until("a profile recording", 10_000, () => sessions().length > 0)

const request = async (url: string, init: RequestInit = {}) => {
  const res = await fetch(url, { method: "POST", ...init })
  return { status: res.status, headers: res.headers, text: await res.text() }
}

describe("POST /debug/cpu-profile", () => {
  it("answers a 1 s profile as .cpuprofile JSON, named for the node, and releases the session", async () => {
    const url = await start()
    const res = await request(`${url}?seconds=1`)
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("application/json")
    expect(res.headers.get("content-disposition")).toMatch(
      /^attachment; filename="cgn-agent-node-a-\d{8}T\d{6}Z\.cpuprofile"$/
    )
    // taken now, on demand: no cache between the operator and the agent answers an older one
    expect(res.headers.get("cache-control")).toBe("no-store")
    const profile = JSON.parse(res.text)
    expect(profile.nodes.length).toBeGreaterThan(0)
    expect(profile.nodes[0].callFrame.functionName).toBe("(root)")
    expect(profile.samples.length).toBeGreaterThan(0)
    expect(profile.timeDeltas.length).toBe(profile.samples.length)
    expect(profile.startTime).toBeLessThan(profile.endTime)
    expect(profile.endTime - profile.startTime).toBeGreaterThanOrEqual(900_000) // µs: it did record ~1 s
    expect(sessions()).toEqual([
      {
        methods: ["Profiler.enable", "Profiler.start", "Profiler.stop", "Profiler.disable"],
        disconnected: true
      }
    ])

    // ?interval_us reaches V8: at 10 ms, 1 s holds about 100 samples (V8's default 1 ms: about 1000)
    const coarse = await request(`${url}?seconds=1&interval_us=10000`)
    expect(coarse.status).toBe(200)
    expect(JSON.parse(coarse.text).samples.length).toBeLessThan(300)
    expect(post).toHaveBeenCalledWith("Profiler.setSamplingInterval", { interval: 10_000 })
  })

  it("refuses a second profile while one runs (409), then takes the next", async () => {
    const url = await start()
    const first = request(`${url}?seconds=2`) // long enough for the second to arrive while it runs
    await recording()
    const second = await request(`${url}?seconds=1`)
    expect(second.status).toBe(409)
    expect(JSON.parse(second.text).error).toMatch(/already being taken/)
    expect((await first).status).toBe(200)
    expect(sessions()).toHaveLength(1) // the refused one never touched the inspector
    expect((await request(`${url}?seconds=1`)).status).toBe(200)
  })

  it("refuses a bad query (400, with why) and other methods (405), before any profiling", async () => {
    const url = await start()
    for (const q of ["seconds=0", "seconds=61", "seconds=abc", "seconds=1.5", "seconds=", "seconds=1e1"]) {
      const res = await request(`${url}?${q}`)
      expect({ q, status: res.status }).toEqual({ q, status: 400 })
      expect(JSON.parse(res.text).error).toMatch(/seconds must be a whole number from 1 to 60/)
    }
    expect(JSON.parse((await request(`${url}?interval_us=50`)).text).error).toMatch(/interval_us .* 100 to 10000/)
    expect(JSON.parse((await request(`${url}?second=5`)).text).error).toMatch(/unknown query parameter "second"/)
    expect(JSON.parse((await request(`${url}?seconds=1&seconds=2`)).text).error).toMatch(/given 2 times/)
    const get = await fetch(url)
    expect([get.status, get.headers.get("allow")]).toEqual([405, "POST, OPTIONS"])
    expect(sessions()).toEqual([])
  })

  it("pure parts: defaults, bounds, the file name", () => {
    expect(parseCpuProfileQuery("")).toEqual(Result.succeed({ seconds: 10, intervalUs: undefined }))
    expect(parseCpuProfileQuery("?seconds=60&interval_us=100")).toEqual(
      Result.succeed({ seconds: 60, intervalUs: 100 })
    )
    expect(Result.isFailure(parseCpuProfileQuery("interval_us=10001"))).toBe(true)
    expect(cpuProfileFileName("gpu-7.dc1", Date.parse("2025-01-02T03:04:05.678Z"))).toBe(
      "cgn-agent-gpu-7.dc1-20250102T030405Z.cpuprofile"
    )
    expect(cpuProfileFileName('a"b\\c é', 0)).toBe("cgn-agent-a_b_c__-19700101T000000Z.cpuprofile")
    // no ':' from the node id either, as none from the time (compactUtc: some file systems and tools refuse it)
    expect(cpuProfileFileName("gpu:7", 0)).toBe("cgn-agent-gpu_7-19700101T000000Z.cpuprofile")
  })

  it("an inspector step that fails answers 500 naming the step and why, and the session is released", async () => {
    const url = await start()
    post.mockImplementation(function (this: Session, ...args: Array<unknown>) {
      if (args[0] === "Profiler.start") return Promise.reject(new Error("inspector says no"))
      return Reflect.apply(realPost, this, args)
    } as Session["post"])
    const res = await request(`${url}?seconds=1`)
    expect([res.status, JSON.parse(res.text).error]).toEqual([
      500,
      "CPU profile: Profiler.start failed: inspector says no"
    ])
    // the session is a scoped resource: released however the request ends, a failed step included
    expect(sessions()).toEqual([
      { methods: ["Profiler.enable", "Profiler.start", "Profiler.disable"], disconnected: true }
    ])
  })
})

describe("POST /debug/cpu-profile auth", () => {
  it("needs the bearer token when one is set (401), as /status does", async () => {
    const url = await start({ admin_token: "s3cret" })
    const missing = await request(`${url}?seconds=1`)
    expect(missing.status).toBe(401)
    expect(missing.headers.get("www-authenticate")).toContain("Bearer")
    expect((await request(`${url}?seconds=1`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401)
    expect(sessions()).toEqual([])
    expect((await request(`${url}?seconds=1`, { headers: { authorization: "Bearer s3cret" } })).status).toBe(200)
  })

  it("on loopback without a token, refuses a web page's request (403)", async () => {
    const url = await start()
    expect((await request(url, { headers: { origin: "http://evil.example" } })).status).toBe(403)
    expect((await request(url, { headers: { "sec-fetch-site": "cross-site" } })).status).toBe(403)
    expect(sessions()).toEqual([])
  })
})

describe("POST /debug/cpu-profile release", () => {
  it("the client going away mid-profile stops the profiler and releases the session and the lock", async () => {
    const url = await start()
    const abort = new AbortController()
    const gone = request(`${url}?seconds=60`, { signal: abort.signal }).catch((e: Error) => e.name)
    await recording()
    abort.abort()
    expect(await gone).toBe("AbortError")
    await until("the session released", 5_000, () => sessions()[0]?.disconnected === true)
    // turned off without building a profile nobody will read
    expect(sessions()[0]!.methods).toEqual(["Profiler.enable", "Profiler.start", "Profiler.disable"])
    const started = performance.now()
    expect((await request(`${url}?seconds=1`)).status).toBe(200) // the lock is free: no 409
    expect(performance.now() - started).toBeLessThan(10_000)
  })

  it("stopping the admin server mid-profile waits for none of its seconds, and releases the session", async () => {
    const url = await start()
    const cut = request(`${url}?seconds=60`).catch((e: Error) => e.name)
    await recording()
    const stop = close!
    close = undefined
    const started = performance.now()
    await stop()
    // bounded by the server's CLOSE_GRACE (1 s) for requests in flight, not by the profile's 60 s
    expect(performance.now() - started).toBeLessThan(10_000)
    expect(await cut).toBe("TypeError") // fetch failed: the connection was dropped
    expect(sessions()).toEqual([
      { methods: ["Profiler.enable", "Profiler.start", "Profiler.disable"], disconnected: true }
    ])
  })
})
