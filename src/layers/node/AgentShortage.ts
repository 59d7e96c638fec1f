/**
 * The live AgentShortage (services/node/AgentShortage.ts): the state machine, and the test that ends a shortage. While
 * the agent is taken as short, every engine.liveness_interval it opens a fresh TCP connection to the engine's port and
 * closes it: a connection made, refused by a closed port (an engine restarting) or still pending (a remote host that
 * does not answer) shows the host gave it a socket; an error of the host's shortage (HostShortage.ts), or a failure
 * before the engine's name was resolved, keeps it short. Not the probes' keep-alive dispatcher: a pooled
 * connection would pass with the host still out of descriptors.
 */
import { Duration, Effect, Layer, Schedule } from "effect"
import { Config } from "../../services/config/Config.ts"
import { AgentShortage, make, ShortageEvent } from "../../services/node/AgentShortage.ts"
import { hostShortage } from "../../services/node/HostShortage.ts"
import { listenOf } from "../engine/backends/common.ts"
import { connectOnce } from "../net/connectOnce.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"

/** How long the test waits on its connection: pending past this (the name resolved), the host gave it a socket. */
const TEST_TIMEOUT_MS = 1_000

/**
 * One fresh connection to host:port, closed at once: undefined when the host gave the agent a socket (a connection
 * made, refused or unanswered once the name was resolved, or any error of the connection's own), else what ran out
 * or why nothing is known yet: a shortage's code (HostShortage.ts), or a failure before the engine's name was
 * resolved (a lookup in a process out of descriptors can fail ENOTFOUND, getaddrinfo's, not EMFILE).
 */
export const connectTest = (host: string, port: number): Effect.Effect<string | undefined> =>
  Effect.map(connectOnce(host, port, TEST_TIMEOUT_MS), (o) => {
    switch (o._tag) {
      case "Connected":
        return undefined
      case "Failed": {
        const shortage = hostShortage(o.code)
        if (shortage !== undefined) return `${o.code}: ${shortage}`
        return o.resolved ? undefined : `${host} not resolved (${o.code})`
      }
      case "Pending":
        return o.resolved ? undefined : `${host} not resolved within ${TEST_TIMEOUT_MS} ms`
    }
  })

export const layer: Layer.Layer<AgentShortage, never, Config> = Layer.effect(
  AgentShortage,
  Effect.gen(function* () {
    const config = yield* Config
    const shortage = yield* make({
      calls: config.engine.failed_calls_unhealthy,
      probes: config.engine.liveness_failures
    })
    const { host, port } = listenOf(config)
    const test = Effect.gen(function* () {
      if ((yield* shortage.current) === undefined) return
      if ((yield* connectTest(host, port)) === undefined) yield* shortage.report(ShortageEvent.TestPassed())
    })
    yield* test.pipe(
      Effect.repeat(Schedule.spaced(Duration.toMillis(config.engine.liveness_interval))),
      background("the agent's shortage test", "a shortage of the agent's is no longer seen to end", {
        restart: RESTART
      }),
      Effect.forkScoped
    )
    return shortage
  })
)
