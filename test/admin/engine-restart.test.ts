// POST /engine/restart over real loopback, on the test supervisor (src/testing/EngineProcess.ts records the restarts
// asked of it): a Ready engine is restarted (202), one waiting out a restart backoff has the wait ended (202), one
// starting is not (409), nor one under a drain or a proxied server (409); the method and the admin token. The live supervisor's restart(): test/engine/supervisor-clock.test.ts.
import { Context, Effect } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { ADMIN_RESTART_REASON } from "../../src/services/admin/EngineRestart.ts"
import type { EngineState, ExitRecord } from "../../src/services/engine/EngineProcess.ts"
import { State } from "../../src/services/engine/EngineState.ts"
import * as EngineTest from "../../src/testing/EngineProcess.ts"
import { startAdmin } from "../support/admin.ts"

const closes: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const close of closes.splice(0)) await close()
})

const start = async (
  options: {
    agent?: Record<string, unknown>
    ready?: boolean
    spawns?: boolean
    initial?: EngineState
    logs?: Array<string>
  } = {}
) => {
  const initial = options.initial ?? (options.ready === false ? undefined : State.Ready({ since: 0, run: 0 }))
  const engine = EngineTest.layerTest({
    plan: EngineTest.testPlan({ spawns: options.spawns ?? true }),
    ...(initial === undefined ? {} : { initial })
  })
  const admin = await startAdmin({
    ...(options.agent ? { agent: options.agent } : {}),
    ...(options.logs ? { logs: options.logs } : {}),
    engine
  })
  closes.push(admin.close)
  const requests = () => Effect.runPromise(Context.get(admin.ctx, EngineTest.EngineProcessControl).restartRequests)
  return { base: admin.url, url: `${admin.url}/engine/restart`, requests }
}

const post = async (url: string, init: RequestInit = {}) => {
  const res = await fetch(url, { method: "POST", ...init })
  return { status: res.status, body: (await res.json()) as Record<string, unknown> }
}

describe("POST /engine/restart", () => {
  it("restarts a Ready engine with the admin reason, logged; GET is 405", async () => {
    const logs: Array<string> = []
    const { url, requests } = await start({ logs })
    expect(await post(url)).toEqual({ status: 202, body: { restarting: true } })
    // the README's words for who asked, in the run's exit record and the log
    expect(ADMIN_RESTART_REASON).toBe("asked for over the admin API (POST /engine/restart)")
    expect(await requests()).toEqual([{ source: "admin", reason: ADMIN_RESTART_REASON }])
    expect(logs.filter((l) => l.includes("restarting the engine"))).toEqual([
      // info: an operator's intended action, no fault (test/admin/engine-restart-409.test.ts says why)
      "Info restarting the engine: asked for over the admin API (POST /engine/restart)"
    ])
    const get = await fetch(url)
    expect(get.status).toBe(405)
    expect(get.headers.get("allow")).toBe("POST, OPTIONS")
  })

  it("in a crash loop's restart backoff, ends the wait (202, backoffEnded) with the admin reason", async () => {
    const lastExit: ExitRecord = {
      run: 4,
      pid: 123,
      code: 1,
      signal: null,
      startedAt: 0,
      endedAt: 100,
      runtimeMs: 100,
      reason: "exited",
      endedBy: { kind: "exited" },
      lastLines: [],
      oomKills: undefined,
      memoryLimitBytes: undefined
    }
    const initial = State.Restarting({ attempt: 5, nextAt: 300_000, lastExit, failing: "engine failing: ..." })
    const { url, requests } = await start({ initial })
    expect(await post(url)).toEqual({ status: 202, body: { restarting: true, backoffEnded: true } })
    expect(await requests()).toEqual([{ source: "admin", reason: ADMIN_RESTART_REASON }])
  })

  it("an engine that is not Ready, a draining node and a proxied server are 409 with why, and nothing is asked", async () => {
    const starting = await start({ ready: false })
    expect(await post(starting.url)).toEqual({
      status: 409,
      body: {
        error: "the engine is starting (phase loading, run 0): nothing was done; a starting run is not restarted"
      }
    })
    expect(await starting.requests()).toEqual([])

    const draining = await start()
    expect((await post(`${draining.base}/drain`)).status).toBe(202)
    expect(await post(draining.url)).toEqual({
      status: 409,
      body: { error: "the node is draining: the engine is stopped at the drain's end" }
    })
    expect(await draining.requests()).toEqual([])

    const proxied = await start({ spawns: false })
    const answer = await post(proxied.url)
    expect(answer.status).toBe(409)
    expect(answer.body.error).toMatch(/^engine.kind = openai_compat: the agent does not run that server/)
  })

  it("needs the admin token when one is set", async () => {
    const { url, requests } = await start({ agent: { admin_token: "s3cret" } })
    expect((await post(url)).status).toBe(401)
    expect(await requests()).toEqual([])
    expect((await post(url, { headers: { authorization: "Bearer s3cret" } })).status).toBe(202)
  })
})
