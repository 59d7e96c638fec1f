/**
 * The live AgentShortage (services/node/AgentShortage.ts): the state machine, and the test that ends a shortage. While
 * the agent is taken as short, every engine.liveness_interval it opens a fresh TCP connection to the engine's port and
 * closes it: a connection made, or refused by a closed port (an engine restarting), shows the host gave it a socket; an
 * error of the host's shortage (HostShortage.ts) keeps it short. Not the probes' keep-alive dispatcher: a pooled
 * connection would pass with the host still out of descriptors.
 */
import * as net from "node:net"
import { Duration, Effect, Layer, Option, Schedule } from "effect"
import { Config } from "../../services/config/Config.ts"
import { AgentShortage, make, ShortageEvent } from "../../services/node/AgentShortage.ts"
import { hostShortage } from "../../services/node/HostShortage.ts"
import { listenOf } from "../engine/backends/common.ts"
import { errorCode } from "../engine/exchange.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"

/** A connect still pending after this had its socket: the host is not short of one. */
const TEST_TIMEOUT_MS = 1_000

/** What ran out, when `e` says the host could not open the connection; undefined for any other outcome. */
const shortageOf = (e: unknown): string | undefined => {
  const code = errorCode(e)
  const words = hostShortage(code)
  return words === undefined ? undefined : `${code}: ${words}`
}

/** One fresh connection to host:port, closed at once: undefined when the host gave a socket, else what ran out. */
export const connectTest = (host: string, port: number): Effect.Effect<string | undefined> =>
  Effect.callback<string | undefined>((resume) => {
    let socket: net.Socket
    try {
      socket = net.connect({ host, port })
    } catch (e) {
      resume(Effect.succeed(shortageOf(e)))
      return
    }
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.succeed(undefined))
    })
    socket.once("error", (e) => {
      socket.destroy()
      resume(Effect.succeed(shortageOf(e)))
    })
    return Effect.sync(() => socket.destroy())
  }).pipe(Effect.timeoutOption(TEST_TIMEOUT_MS), Effect.map(Option.getOrUndefined))

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
