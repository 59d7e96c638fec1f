// Metrics: handles land in the registry with the cgn_agent_ prefix, collect callbacks run per scrape and
// are removed with their scope, a failing callback does not break the scrape.
import { Effect, Exit, Scope } from "effect"
import { describe, expect, it } from "vitest"
import * as MetricsLayer from "../src/layers/Metrics.ts"
import { ENGINE_STATES, Metrics, setCounter, setStateGauge } from "../src/services/Metrics.ts"

const run = <A>(eff: Effect.Effect<A, never, Metrics>, layer = MetricsLayer.layerTest) =>
  Effect.runPromise(eff.pipe(Effect.provide(layer)))

describe("Metrics", () => {
  it("registers every series with the prefix and renders them", async () => {
    const text = await run(
      Effect.gen(function* () {
        const m = yield* Metrics
        m.requests.inc({ role: "both", model: "m", status: "OK" })
        m.timeToFirstToken.observe({ role: "both", model: "m" }, 0.2)
        m.relayedTokens.inc({ model: "m" }, 5)
        setCounter(m.engineRestarts, 3)
        setStateGauge(m.engineState, ENGINE_STATES, "ready")
        return yield* m.render
      })
    )
    expect(text.contentType).toContain("text/plain")
    expect(text.body).toContain('cgn_agent_requests_total{role="both",model="m",status="OK"} 1')
    expect(text.body).toContain('cgn_agent_time_to_first_token_seconds_bucket{le="0.25",role="both",model="m"} 1')
    expect(text.body).toContain('cgn_agent_relayed_tokens_total{model="m"} 5')
    expect(text.body).toContain("cgn_agent_engine_restarts_total 3")
    expect(text.body).toContain('cgn_agent_engine_state{state="ready"} 1')
    expect(text.body).toContain('cgn_agent_engine_state{state="starting"} 0')
    for (const name of ["inflight_requests", "gpu_memory_total_bytes", "etcd_lease_age_seconds"]) {
      expect(text.body).toContain(`# TYPE cgn_agent_${name} gauge`)
    }
    expect(text.body).not.toContain("process_cpu")
  })

  it("runs collect callbacks per scrape until their scope closes; failures are contained", async () => {
    const result = await run(
      Effect.gen(function* () {
        const m = yield* Metrics
        let n = 0
        const scope = yield* Scope.make()
        yield* m.onCollect(Effect.sync(() => m.inflight.set(++n))).pipe(Scope.provide(scope))
        yield* m.onCollect(Effect.die("boom")).pipe(Scope.provide(scope))
        const first = (yield* m.render).body
        const second = (yield* m.render).body
        yield* Scope.close(scope, Exit.void)
        const third = (yield* m.render).body
        return { first, second, third, n }
      })
    )
    expect(result.first).toContain("cgn_agent_inflight_requests 1")
    expect(result.second).toContain("cgn_agent_inflight_requests 2")
    expect(result.third).toContain("cgn_agent_inflight_requests 2")
    expect(result.n).toBe(2)
  })

  it("the live layer adds process metrics; event-loop lag is the EventLoopLag window's worst", async () => {
    const sample = { currentMs: 1, p99Ms: 5, windowMaxMs: 250, maxMs: 900, windowMs: 5000 }
    const body = await run(
      Effect.gen(function* () {
        yield* MetricsLayer.mirrorEventLoopLag(Effect.succeed(sample))
        return yield* Effect.flatMap(Metrics, (m) => m.render)
      }).pipe(Effect.scoped),
      MetricsLayer.layer
    )
    expect(body.body).toContain("cgn_agent_process_cpu_seconds_total")
    expect(body.body).toContain("cgn_agent_event_loop_lag_seconds 0.25")
  })
})

describe("mirrorRegistration", () => {
  it("sets the etcd gauges from the reporter's status at scrape time", async () => {
    const status = {
      state: "registered",
      key: "/cgn/c/nodes/n",
      leaseId: "1",
      epoch: "1",
      leaseTtlMs: 15000,
      leaseAgeMs: 2500,
      sinceKeepAliveMs: 100,
      sequence: 3,
      lastWriteAt: undefined,
      publishedState: "ready",
      lastError: undefined,
      conflict: undefined,
      writes: 3,
      writeFailures: 0,
      leasesGranted: 1,
      leasesLost: 0
    } as const
    const body = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorRegistration(Effect.succeed(status))
          return (yield* (yield* Metrics).render).body
        })
      )
    )
    expect(body).toContain("cgn_agent_etcd_registered 1")
    expect(body).toContain('cgn_agent_etcd_registration_state{state="registered"} 1')
    expect(body).toContain('cgn_agent_etcd_registration_state{state="retrying"} 0')
    expect(body).toContain("cgn_agent_etcd_lease_age_seconds 2.5")
  })
})
