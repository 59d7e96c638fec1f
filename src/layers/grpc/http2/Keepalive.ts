/**
 * The gRPC server's keepalive (services/grpc/Keepalive.ts has the rule): one timer looks at every connection's bytes
 * read, pings those silent for agent.keepalive_time, and closes those still silent agent.keepalive_timeout later,
 * reported as the guard's closures are (`keepalive_timeout`, never cooled down: a peer that went away did no harm).
 * Their calls see 'cancelled', as at any connection's loss.
 */
import type * as http2 from "node:http2"
import { peerOf } from "../../../services/grpc/ConnectionCaps.ts"
import {
  type KeepaliveTimes,
  type Liveness,
  liveness,
  livenessStep,
  lookEveryMs
} from "../../../services/grpc/Keepalive.ts"
import type { GuardEvent } from "./Guard.ts"
import { counters } from "./socketCounters.ts"

interface Followed {
  readonly peer: string
  liveness: Liveness
}

/** The PING's callback: its ACK is seen as bytes read; a PING cancelled by the session's end needs nothing. */
const ignore = (): void => {}

/** Time is performance.now(), monotonic (as the guard's: a wall-clock step must not close every connection). */
export class Keepalive {
  readonly #times: KeepaliveTimes
  readonly #onEvent: (event: GuardEvent) => void
  readonly #sessions = new Map<http2.Http2Session, Followed>()
  #timer: NodeJS.Timeout | undefined

  constructor(times: KeepaliveTimes, onEvent: (event: GuardEvent) => void) {
    this.#times = times
    this.#onEvent = onEvent
  }

  /** Follows `session` from now until it closes (the timer starts with the first one). */
  follow(session: http2.Http2Session): void {
    const now = performance.now()
    this.#sessions.set(session, {
      peer: peerOf(session.socket?.remoteAddress),
      liveness: liveness(counters(session)?.read ?? 0, now)
    })
    session.once("close", () => this.#sessions.delete(session))
    if (this.#timer === undefined) {
      this.#timer = setInterval(this.#look, lookEveryMs(this.#times))
      this.#timer.unref()
    }
  }

  /** Stops looking (the server is closing: what is left closes with it). */
  stop(): void {
    clearInterval(this.#timer)
  }

  readonly #look = (): void => {
    const now = performance.now()
    for (const [session, f] of this.#sessions) {
      const read = counters(session)?.read
      if (session.destroyed || read === undefined) continue
      const step = livenessStep(f.liveness, read, now, this.#times)
      f.liveness = step.liveness
      if (step.action === "ping") {
        // Throws only for a destroyed session; false past node:http2's 10 PINGs unanswered: a client that sends other
        // bytes but never answers PINGs is heard (so pinged again, never closed) and gets no more than those 10.
        try {
          session.ping(ignore)
        } catch {}
      } else if (step.action === "close") {
        this.#sessions.delete(session)
        // GOAWAY NO_ERROR if the socket still takes it, then the socket closes: nothing to wait for from a peer gone.
        session.destroy()
        this.#onEvent({ kind: "closed", reason: "keepalive_timeout", peer: f.peer })
      }
    }
  }
}
