// Metrics: handles land in the registry with the cgn_agent_ prefix, collect callbacks run per scrape and
// are removed with their scope, a failing callback does not break the scrape.
import { Effect, Exit, Scope } from "effect"
import { describe, expect, it } from "vitest"
import * as MetricsLayer from "../../src/layers/observability/Metrics.ts"
import type { LagSample } from "../../src/services/node/EventLoopLag.ts"
import {
  ENGINE_STATES,
  Metrics,
  setCounter,
  setOptional,
  setStateGauge
} from "../../src/services/observability/Metrics.ts"
import type { RegistrationStatus } from "../../src/services/registry/HealthReporter.ts"
import type { TlsStatus } from "../../src/services/tls/Tls.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"

const run = <A>(eff: Effect.Effect<A, never, Metrics>, layer = MetricsTest.layerTest) =>
  Effect.runPromise(eff.pipe(Effect.provide(layer)))

describe("Metrics", () => {
  it("registers every series with the prefix and renders them", async () => {
    const text = await run(
      Effect.gen(function* () {
        const m = yield* Metrics
        m.requests.inc({ role: "both", model: "m", grpc_code: "OK" })
        m.timeToFirstToken.observe({ role: "both", model: "m" }, 0.2)
        m.relayedTokens.inc({ model: "m" }, 5)
        setCounter(m.engineRestarts, 3)
        setStateGauge(m.engineState, ENGINE_STATES, "ready")
        return yield* m.render
      })
    )
    expect(text.contentType).toContain("text/plain")
    expect(text.body).toContain('cgn_agent_requests_total{role="both",model="m",grpc_code="OK"} 1')
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
    expect(body.body).toContain("cgn_agent_event_loop_lag_seconds 0.25")
  })

  it("process and nodejs metrics keep their stock names; no gauge ends in _total", async () => {
    const body = (
      await run(
        Effect.flatMap(Metrics, (m) => m.render),
        MetricsLayer.layer
      )
    ).body
    expect(body).toMatch(/^process_cpu_seconds_total \d/m)
    expect(body).toMatch(/^process_resident_memory_bytes \d/m)
    expect(body).toMatch(/^nodejs_heap_size_used_bytes \d/m)
    expect(body).not.toContain("cgn_agent_process_")
    expect(body).not.toContain("cgn_agent_nodejs_")
    const types = [...body.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => ({ name: m[1]!, type: m[2]! }))
    expect(types.length).toBeGreaterThan(20)
    expect(types.filter((t) => t.name.endsWith("_total") && t.type !== "counter")).toEqual([])
  })

  it("a scrape resets nothing: two scrapers read the same event-loop lag, mirrored from its window", async () => {
    // The lag service's last completed window (layers/node/EventLoopLag.ts rolls it on its own timer, never
    // on a scrape): every scrape reads it as it is.
    const window: LagSample = { currentMs: 3, p99Ms: 30, windowMaxMs: 42, maxMs: 42, windowMs: 5_000 }
    let samples = 0
    const lag = Effect.sync(() => {
      samples++
      return window
    })
    const bodies = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorEventLoopLag(lag)
          const m = yield* Metrics
          const first = (yield* m.render).body
          const second = (yield* m.render).body
          return [first, second] as const
        })
      ),
      MetricsLayer.layer
    )
    const lagLines = (body: string) =>
      body
        .split("\n")
        .filter((l) => /^\w*event_?loop_lag\w* /.test(l) && !l.startsWith("nodejs_eventloop_lag_seconds "))
    expect(samples).toBe(2)
    expect(lagLines(bodies[0])).toEqual(["cgn_agent_event_loop_lag_seconds 0.042"])
    expect(lagLines(bodies[1])).toEqual(lagLines(bodies[0]))
    // prom-client's own lag series reset their histogram at every scrape: the production registry has none.
    for (const name of MetricsLayer.DROPPED_DEFAULT_METRICS) {
      expect(bodies[0]).not.toContain(`${name} `)
      expect(bodies[1]).not.toContain(`${name} `)
    }
  })

  it("a value that does not exist is a missing series, not a sentinel", async () => {
    const bodies = await run(
      Effect.gen(function* () {
        const m = yield* Metrics
        setOptional(m.engineKvCacheUsage, 0.5)
        const set = (yield* m.render).body
        setOptional(m.engineKvCacheUsage, undefined)
        return { set, unset: (yield* m.render).body }
      })
    )
    expect(bodies.set).toContain("cgn_agent_engine_kv_cache_usage_ratio 0.5")
    expect(bodies.unset).toContain("# TYPE cgn_agent_engine_kv_cache_usage_ratio gauge")
    expect(bodies.unset).not.toMatch(/^cgn_agent_engine_kv_cache_usage_ratio /m)
  })

  it("build_info carries the version, Node's version and the engine kind", async () => {
    const body = await run(
      Effect.andThen(MetricsLayer.recordBuildInfo({ version: "1.2.3", engine: "sglang" }), (_) =>
        Effect.flatMap(Metrics, (m) => m.render)
      )
    )
    expect(body.body).toContain(
      `cgn_agent_build_info{version="1.2.3",node_version="${process.version}",engine="sglang"} 1`
    )
  })
})

describe("mirrorNodeState", () => {
  it("sets the node state one-hot from the node's snapshot at every scrape", async () => {
    let state = "ready"
    const bodies = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorNodeState(Effect.sync(() => ({ state })))
          const m = yield* Metrics
          const ready = (yield* m.render).body
          state = "unhealthy"
          return { ready, unhealthy: (yield* m.render).body }
        })
      )
    )
    expect(bodies.ready).toContain('cgn_agent_node_state{state="ready"} 1')
    expect(bodies.ready).toContain('cgn_agent_node_state{state="unhealthy"} 0')
    expect(bodies.unhealthy).toContain('cgn_agent_node_state{state="unhealthy"} 1')
    expect(bodies.unhealthy).toContain('cgn_agent_node_state{state="ready"} 0')
    for (const s of ["starting", "draining"]) expect(bodies.unhealthy).toContain(`cgn_agent_node_state{state="${s}"} 0`)
  })
})

describe("mirrorNodeState and the cordon", () => {
  it("cordoned_since is the cordon's persisted since, in seconds, and absent when not cordoned", async () => {
    let cordon: { readonly since: number } | undefined = { since: 1_764_000_000_000 }
    const bodies = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorNodeState(
            Effect.succeed({ state: "cordoned" }),
            Effect.sync(() => cordon)
          )
          const m = yield* Metrics
          const cordoned = (yield* m.render).body
          cordon = undefined
          return { cordoned, uncordoned: (yield* m.render).body }
        })
      )
    )
    // the whole line: a value in milliseconds (1764000000000) starts with the same digits
    expect(bodies.cordoned).toMatch(/^cgn_agent_node_cordoned_since_seconds 1764000000$/m)
    expect(bodies.uncordoned).not.toMatch(/^cgn_agent_node_cordoned_since_seconds /m)
  })
})

describe("mirrorRegistration", () => {
  it("sets the etcd gauges and the lost-lease counter from the reporter's status at scrape time", async () => {
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
    let current: RegistrationStatus = status
    const { body, lost } = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorRegistration(Effect.sync(() => current))
          const m = yield* Metrics
          const body = (yield* m.render).body
          current = {
            ...status,
            state: "revoked",
            leaseAgeMs: undefined,
            sinceKeepAliveMs: undefined,
            leasesLost: 1,
            writeFailures: 4
          }
          return { body, lost: (yield* m.render).body }
        })
      )
    )
    expect(body).toMatch(/^cgn_agent_etcd_registered 1$/m)
    expect(body).toContain('cgn_agent_etcd_registration_state{state="registered"} 1')
    expect(body).toContain('cgn_agent_etcd_registration_state{state="retrying"} 0')
    expect(body).toContain("cgn_agent_etcd_lease_age_seconds 2.5")
    // Without a lease the age is a missing series, not 0 (which would read as a lease granted just now).
    expect(lost).toContain("cgn_agent_etcd_registered 0")
    expect(lost).not.toMatch(/^cgn_agent_etcd_lease_age_seconds /m)
    // a lost lease (the key gone until the next keepalive) counted, not only in /status: 0 from the start, then 1
    expect([body, lost].map((b) => /^cgn_agent_etcd_leases_lost_total (\d+)$/m.exec(b)?.[1])).toEqual(["0", "1"])
    // failed steps counted where a scrape sees them; the keepalive's age only while there is a lease
    expect([body, lost].map((b) => /^cgn_agent_etcd_failures_total (\d+)$/m.exec(b)?.[1])).toEqual(["0", "4"])
    expect(body).toContain("cgn_agent_etcd_keepalive_age_seconds 0.1")
    expect(lost).not.toMatch(/^cgn_agent_etcd_keepalive_age_seconds /m)
  })
})

describe("mirrorTls", () => {
  it("sets the TLS gauges from the Tls status at scrape time; no expiry sample in plaintext", async () => {
    let current: TlsStatus = { enabled: true, generation: 2, certificateNotAfter: "2027-01-02T03:04:05.000Z" }
    const bodies = await run(
      Effect.scoped(
        Effect.gen(function* () {
          yield* MetricsLayer.mirrorTls(Effect.sync(() => current))
          const m = yield* Metrics
          const fine = (yield* m.render).body
          current = {
            ...current,
            reloadError: "security.key_file (/k.pem): the key does not belong to the certificate"
          }
          const failing = (yield* m.render).body
          current = { enabled: false, generation: 0 }
          return { fine, failing, plain: (yield* m.render).body }
        })
      )
    )
    expect(bodies.fine).toContain("cgn_agent_tls_reload_failing 0")
    expect(bodies.fine).toContain(
      `cgn_agent_tls_certificate_expiry_timestamp_seconds ${Date.UTC(2027, 0, 2, 3, 4, 5) / 1000}`
    )
    expect(bodies.failing).toMatch(/^cgn_agent_tls_reload_failing 1$/m)
    expect(bodies.plain).toContain("cgn_agent_tls_reload_failing 0")
    expect(bodies.plain).not.toMatch(/^cgn_agent_tls_certificate_expiry_timestamp_seconds /m)
  })
})
