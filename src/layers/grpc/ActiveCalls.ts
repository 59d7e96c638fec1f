/**
 * The Generate calls being relayed now: what the drain counts, waits for and aborts, and what the stall
 * watchdog looks at. The "no call left" signal is a Latch, open exactly while the set is empty.
 */
import { Effect, Latch } from "effect"
import type { Relay } from "./Relay.ts"

export class ActiveCalls {
  readonly relays = new Set<Relay>()
  /** Calls that completed (their engine stream ended as the engine ends one) since the watchdog last looked. */
  completed = 0
  readonly #idle = Latch.makeUnsafe(true)

  add(relay: Relay): void {
    this.relays.add(relay)
    this.#idle.closeUnsafe()
  }

  delete(relay: Relay): void {
    if (!this.relays.delete(relay)) return
    if (relay.completed) this.completed++
    if (this.relays.size === 0) this.#idle.openUnsafe()
  }

  get size(): number {
    return this.relays.size
  }

  /** Completes when no call is being relayed (at once if none is). */
  readonly awaitEmpty: Effect.Effect<void> = Effect.suspend(() => this.#idle.await)
}
