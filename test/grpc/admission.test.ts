// Admission: the pure ledger by tables, then the live service under bursts, interruption, FIFO order and drain.
// Fibers only (no I/O): `settle` yields until the counters reach the expected state, with a bound.
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Result, Scope } from "effect"
import { MixedScheduler, Scheduler } from "effect/Scheduler"
import { TestClock } from "effect/testing"
import { Status } from "nice-grpc-common"
import { layerFromObject } from "../../src/layers/config/Config.ts"
import * as AdmissionLive from "../../src/layers/grpc/Admission.ts"
import {
  Admission,
  AdmissionLedger,
  type AdmissionService,
  Draining,
  type EnterResult,
  Overloaded
} from "../../src/services/grpc/Admission.ts"
import { toGrpcFailure } from "../../src/services/grpc/GrpcStatus.ts"
import { hold, settle } from "../support/admission.ts"

const counts = (a: AdmissionService) => Effect.map(a.stats, (s) => ({ inflight: s.inflight, queued: s.queued }))

describe("AdmissionLedger (pure)", () => {
  it("enter: slot, queue, refusal, drain", () => {
    const ledger = new AdmissionLedger<string>(2, 1)
    const steps: Array<[string, EnterResult, number, number]> = [
      ["a", "admitted", 1, 0],
      ["b", "admitted", 2, 0],
      ["c", "queued", 2, 1],
      ["d", "overloaded", 2, 1],
      ["e", "overloaded", 2, 1]
    ]
    for (const [w, expected, inflight, queued] of steps) {
      assert.strictEqual(ledger.enter(w), expected, w)
      assert.deepStrictEqual([ledger.inflight, ledger.queued], [inflight, queued], w)
    }
    assert.strictEqual(ledger.release(), "c", "the freed slot goes to the oldest waiter")
    assert.deepStrictEqual([ledger.inflight, ledger.queued], [2, 0])
    assert.strictEqual(ledger.release(), undefined)
    assert.strictEqual(ledger.release(), undefined)
    assert.isTrue(ledger.idle)
    assert.throws(() => ledger.release())
    ledger.close(false)
    assert.strictEqual(ledger.enter("f"), "draining")
    assert.deepStrictEqual(ledger.stats(), {
      inflight: 0,
      queued: 0,
      maxInflight: 2,
      maxQueue: 1,
      draining: true,
      admitted: 3,
      refusedOverloaded: 2,
      refusedDraining: 1,
      shedAtArrival: 0,
      shedAtSlot: 0
    })
  })

  it("cancel removes only queued waiters; FIFO survives a cancel in the middle", () => {
    const ledger = new AdmissionLedger<string>(1, 3)
    for (const w of ["h", "q1", "q2", "q3"]) ledger.enter(w)
    assert.isTrue(ledger.cancel("q2"))
    assert.isFalse(ledger.cancel("q2"))
    assert.isFalse(ledger.cancel("h"))
    assert.deepStrictEqual([ledger.release(), ledger.release(), ledger.release()], ["q1", "q3", undefined])
  })

  it("max_queue 0 refuses as soon as the slots are full; close(rejectQueued) empties the queue", () => {
    const noQueue = new AdmissionLedger<number>(1, 0)
    assert.deepStrictEqual([noQueue.enter(1), noQueue.enter(2)], ["admitted", "overloaded"])
    const ledger = new AdmissionLedger<number>(1, 2)
    for (const w of [1, 2, 3]) ledger.enter(w)
    assert.deepStrictEqual(ledger.close(true), [2, 3])
    assert.deepStrictEqual([ledger.inflight, ledger.queued, ledger.stats().refusedDraining], [1, 0, 2])
  })

  it("rejects invalid limits", () => {
    assert.throws(() => new AdmissionLedger(0, 1))
    assert.throws(() => new AdmissionLedger(1, -1))
    assert.throws(() => new AdmissionLedger(1.5, 1))
  })
})

describe("Admission (live)", () => {
  it.effect("a burst far above max_inflight + max_queue: exact admitted, queued and refused counts", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 4, maxQueue: 10 })
      const gate = yield* Deferred.make<void>()
      const burst = 1000
      const fibers = yield* Effect.forEach(Array.from({ length: burst }), () =>
        Effect.forkChild(Effect.result(Effect.scoped(Effect.andThen(a.acquire, Deferred.await(gate)))))
      )
      yield* settle(Effect.map(a.stats, (s) => s.inflight + s.queued + s.refusedOverloaded === burst))
      const during = yield* a.stats
      assert.deepStrictEqual(
        [during.inflight, during.queued, during.refusedOverloaded, during.admitted],
        [4, 10, 986, 4]
      )
      yield* Deferred.succeed(gate, undefined)
      const results = yield* Effect.forEach(fibers, Fiber.join)
      const refused = results.filter(Result.isFailure)
      assert.strictEqual(results.filter(Result.isSuccess).length, 14)
      assert.strictEqual(refused.length, 986)
      for (const r of refused) assert.instanceOf(r.failure, Overloaded)
      const after = yield* a.stats
      assert.deepStrictEqual([after.inflight, after.queued, after.admitted], [0, 0, 14])
      yield* a.awaitIdle
    })
  )

  it.effect("queued callers are admitted in FIFO order", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 5 })
      const holder = yield* hold(a)
      const order: Array<number> = []
      const fibers: Array<Fiber.Fiber<void, unknown>> = []
      for (let i = 1; i <= 5; i++) {
        fibers.push(yield* Effect.forkChild(Effect.scoped(Effect.map(a.acquire, () => void order.push(i)))))
        yield* settle(Effect.map(a.queued, (q) => q === i))
      }
      yield* Scope.close(holder, Exit.void)
      yield* Effect.forEach(fibers, Fiber.join)
      assert.deepStrictEqual(order, [1, 2, 3, 4, 5])
      assert.deepStrictEqual(yield* counts(a), { inflight: 0, queued: 0 })
    })
  )

  it.effect("interrupting a queued caller leaves no queue entry and no slot", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 2 })
      const holder = yield* hold(a)
      const first = yield* Effect.forkChild(Effect.scoped(Effect.andThen(a.acquire, Effect.never)))
      yield* settle(Effect.map(a.queued, (q) => q === 1))
      const secondDone = yield* Deferred.make<void>()
      const second = yield* Effect.forkChild(Effect.scoped(Effect.andThen(a.acquire, Deferred.await(secondDone))))
      yield* settle(Effect.map(a.queued, (q) => q === 2))
      yield* Fiber.interrupt(first)
      assert.deepStrictEqual(yield* counts(a), { inflight: 1, queued: 1 })
      yield* Scope.close(holder, Exit.void)
      yield* settle(Effect.map(a.queued, (q) => q === 0))
      assert.deepStrictEqual(yield* counts(a), { inflight: 1, queued: 0 }, "the slot went to the second caller")
      yield* Deferred.succeed(secondDone, undefined)
      yield* Fiber.join(second)
      assert.deepStrictEqual(yield* counts(a), { inflight: 0, queued: 0 })
    })
  )

  // Completing the waiter's Deferred runs its fiber at once, in the release (Effect's resume is synchronous): by the
  // time the interrupt comes it holds the slot under its scope, and it is that scope's close that gives it back.
  it.effect("a caller interrupted right after it took the slot gives it back as its scope closes", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 1 })
      const holder = yield* hold(a)
      const waiter = yield* Effect.forkChild(Effect.scoped(Effect.andThen(a.acquire, Effect.never)))
      yield* settle(Effect.map(a.queued, (q) => q === 1))
      yield* Scope.close(holder, Exit.void)
      yield* Fiber.interrupt(waiter)
      assert.deepStrictEqual(yield* counts(a), { inflight: 0, queued: 0 })
      yield* a.awaitIdle
      const again = yield* Effect.result(Effect.scoped(a.acquire))
      assert.isTrue(Result.isSuccess(again), "the slot is usable again")
    })
  )

  // The waiter handed the slot (its Deferred completed) but interrupted before its fiber took a step: its wait ends
  // interrupted, with no scope finalizer yet, and the interrupt handler must pass the slot on. Effect resumes a
  // waiter in the very call that completes its Deferred, so this takes a scheduler that has the woken fiber yield
  // at its first step (Effect's own yields only after MaxOpsBeforeYield steps of one run).
  it.effect("a caller interrupted after it is handed the slot, before its fiber resumes, passes the slot on", () =>
    Effect.gen(function* () {
      const base = new MixedScheduler()
      const yieldNext = { armed: false }
      const yieldingOnce: Scheduler = {
        executionMode: base.executionMode,
        shouldYield: (fiber) => {
          if (!yieldNext.armed) return base.shouldYield(fiber)
          yieldNext.armed = false
          return true
        },
        makeDispatcher: () => base.makeDispatcher()
      }
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 2 })
      const holder = yield* hold(a)
      const first = yield* Effect.forkChild(
        Effect.scoped(Effect.andThen(a.acquire, Effect.never)).pipe(Effect.provideService(Scheduler, yieldingOnce))
      )
      yield* settle(Effect.map(a.queued, (q) => q === 1))
      const secondDone = yield* Deferred.make<void>()
      const second = yield* Effect.forkChild(Effect.scoped(Effect.andThen(a.acquire, Deferred.await(secondDone))))
      yield* settle(Effect.map(a.queued, (q) => q === 2))
      // the slot goes to the first waiter, whose fiber is only scheduled to resume; interrupted before it does
      yieldNext.armed = true
      yield* Scope.close(holder, Exit.void)
      assert.isFalse(yieldNext.armed, "the first waiter was woken, and yielded")
      yield* Fiber.interrupt(first)
      assert.isTrue(Exit.hasInterrupts(yield* Fiber.await(first)))
      assert.deepStrictEqual(yield* counts(a), { inflight: 1, queued: 0 }, "the slot went on to the second caller")
      yield* Deferred.succeed(secondDone, undefined)
      yield* Fiber.join(second)
      assert.deepStrictEqual(yield* counts(a), { inflight: 0, queued: 0 }, "nothing leaked")
    })
  )

  it.effect("interrupting a scope holding a slot releases it", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 2, maxQueue: 0 })
      const f = yield* Effect.forkChild(Effect.scoped(Effect.andThen(a.acquire, Effect.never)))
      yield* settle(Effect.map(a.inflight, (n) => n === 1))
      yield* Fiber.interrupt(f)
      assert.strictEqual(yield* a.inflight, 0)
    })
  )

  it.effect("queue time is measured on the clock", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 1 })
      const holder = yield* hold(a)
      const waiter = yield* Effect.forkChild(Effect.scoped(a.acquire))
      yield* settle(Effect.map(a.queued, (q) => q === 1))
      yield* TestClock.adjust("250 millis")
      yield* Scope.close(holder, Exit.void)
      assert.deepStrictEqual(yield* Fiber.join(waiter), { queuedMs: 250, at: 250 })
      assert.deepStrictEqual(yield* Effect.scoped(a.acquire), { queuedMs: 0, at: 250 })
    })
  )

  it.effect("drain: new callers get Draining, holders and queued callers finish, awaitIdle completes", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 2 })
      const holder = yield* hold(a)
      const queued = yield* Effect.forkChild(Effect.scoped(a.acquire))
      yield* settle(Effect.map(a.queued, (q) => q === 1))
      yield* a.close()
      const refused = yield* Effect.flip(Effect.scoped(a.acquire))
      assert.instanceOf(refused, Draining)
      assert.strictEqual(toGrpcFailure(refused).code, Status.UNAVAILABLE)
      const idle = yield* Effect.forkChild(a.awaitIdle)
      yield* Effect.yieldNow
      assert.isUndefined(idle.pollUnsafe(), "not idle while a slot is held")
      yield* Scope.close(holder, Exit.void)
      assert.deepStrictEqual(yield* Fiber.join(queued), { queuedMs: 0, at: 0 })
      yield* Fiber.join(idle)
      const s = yield* a.stats
      assert.deepStrictEqual([s.draining, s.inflight, s.queued, s.refusedDraining, s.admitted], [true, 0, 0, 1, 2])
    })
  )

  it.effect("drain with rejectQueued fails queued callers with Draining at once", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 2 })
      const holder = yield* hold(a)
      const queued = yield* Effect.forEach([1, 2], () => Effect.forkChild(Effect.flip(Effect.scoped(a.acquire))))
      yield* settle(Effect.map(a.queued, (q) => q === 2))
      yield* a.close({ rejectQueued: true })
      for (const f of queued) assert.instanceOf(yield* Fiber.join(f), Draining)
      assert.deepStrictEqual(yield* counts(a), { inflight: 1, queued: 0 })
      yield* Scope.close(holder, Exit.void)
      yield* a.awaitIdle
    })
  )

  it.effect("awaitIdle with a timeout leaves nothing behind", () =>
    Effect.gen(function* () {
      const a = AdmissionLive.make({ maxInflight: 1, maxQueue: 0 })
      const holder = yield* hold(a)
      const timedOut = yield* Effect.forkChild(Effect.timeoutOption(a.awaitIdle, "1 second"))
      yield* Effect.yieldNow
      yield* TestClock.adjust("1 second")
      assert.isTrue((yield* Fiber.join(timedOut))._tag === "None")
      yield* Scope.close(holder, Exit.void)
      yield* a.awaitIdle
    })
  )

  it("Overloaded names the limits and maps to RESOURCE_EXHAUSTED", () => {
    const e = new Overloaded({ maxInflight: 4, maxQueue: 10 })
    assert.include(e.message, "agent.max_inflight = 4")
    assert.include(e.message, "agent.max_queue = 10")
    assert.strictEqual(toGrpcFailure(e).code, Status.RESOURCE_EXHAUSTED)
  })

  it.effect("layer reads [agent].max_inflight and max_queue", () =>
    Effect.gen(function* () {
      const a = yield* Admission
      const s = yield* a.stats
      assert.deepStrictEqual([s.maxInflight, s.maxQueue], [3, 7])
    }).pipe(
      Effect.provide(
        AdmissionLive.layer.pipe(
          Layer.provide(
            layerFromObject({ agent: { max_inflight: 3, max_queue: 7 }, models: { m: { hf_repo: "org/m" } } })
          )
        )
      )
    )
  )
})
