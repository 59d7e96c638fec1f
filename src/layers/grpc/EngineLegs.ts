/**
 * The engine side of one Generate call: admission, then the leg Handoff.planLeg chose, into the call's Relay.
 * A normal or decode leg streams: EngineClient.streamTo puts each network read straight into the relay (no
 * Effect step per read), and the relay's consumer writes it to the call. A prefill leg is one non-streaming
 * engine call whose handoff parameters go in the final message. Each P/D leg has [agent].handoff_timeout.
 */
import { Clock, Duration, Effect, Option } from "effect"
import { Config } from "../../services/config/Config.ts"
import { complete, EngineClient, type EngineError, type RequestOptions } from "../../services/engine/EngineClient.ts"
import { Admission, type AdmissionError } from "../../services/grpc/Admission.ts"
import { LegDeadline } from "../../services/grpc/CallErrors.ts"
import type { RequestPlan } from "../../services/grpc/Generate.ts"
import { extractKvTransferParams, type InvalidHandoff, type LegPlan } from "../../services/grpc/Handoff.ts"
import type { Relay } from "./Relay.ts"

/** How the engine side of a call can fail (all of them members of GrpcStatus's GenerateError). */
export type LegError = EngineError | AdmissionError | InvalidHandoff | LegDeadline

/** Runs one call's engine side into `relay`; it ends when the engine answer has been handed to the relay. */
export type RunLeg = (
  relay: Relay,
  plan: RequestPlan,
  leg: LegPlan,
  opts: RequestOptions
) => Effect.Effect<void, LegError>

export const make = Effect.fnUntraced(function* () {
  const config = yield* Config
  const client = yield* EngineClient
  const admission = Option.getOrUndefined(yield* Effect.serviceOption(Admission))
  const legTimeout = config.agent.handoff_timeout
  const legDeadline = (leg: "prefill" | "decode", relay: Relay) =>
    new LegDeadline({ leg, timeout: Duration.format(legTimeout), queued: !relay.admitted })
  const streamTo = client.streamTo

  // One non-streaming call; its answer is read for finish/usage only (the text comes from the decode leg).
  const prefillLeg = (relay: Relay, plan: RequestPlan, leg: LegPlan, opts: RequestOptions) =>
    complete(client, plan.path, leg.body, opts).pipe(
      Effect.flatMap((response) => {
        relay.reader.read(response)
        if (leg._tag !== "VllmPrefill") return Effect.void
        return Effect.map(Effect.fromResult(extractKvTransferParams(response)), (params) => {
          relay.reader.kvTransferParams = params as Record<string, unknown>
        })
      })
    )

  // From here on the engine is asked for a stream: the stall watchdog counts idle time from now.
  const engineStream = (relay: Relay, plan: RequestPlan, leg: LegPlan, opts: RequestOptions) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      relay.idleSince = now
      relay.streamingSince = now
      relay.seenReads = relay.reads
      relay.streaming = true
      return streamTo(plan.path, leg.body, opts, relay)
    })

  // A decode leg waits for the KV transfer before its first chunk: that wait is what the deadline bounds.
  const decodeDeadline = (relay: Relay) =>
    Effect.sleep(legTimeout).pipe(
      Effect.andThen(Effect.suspend(() => (relay.started ? Effect.never : Effect.fail(legDeadline("decode", relay)))))
    )

  const admitted = (relay: Relay, engineSide: Effect.Effect<void, LegError>): Effect.Effect<void, LegError> => {
    if (admission === undefined) {
      relay.admitted = true
      return engineSide
    }
    return Effect.scoped(
      Effect.flatMap(admission.acquire, (permit) => {
        relay.queueMs = permit.queuedMs
        relay.admitted = true
        return engineSide
      })
    )
  }

  // A P/D leg's deadline counts its wait for admission too: the prefill engine holds the KV blocks, and the
  // router the other leg, for the whole leg, so a leg queued behind busy ones must not get a fresh timeout
  // once admitted.
  const runLeg: RunLeg = (relay, plan, leg, opts) => {
    if (leg._tag === "Normal") return admitted(relay, engineStream(relay, plan, leg, opts))
    if (leg._tag === "VllmPrefill" || (leg._tag === "SglangLeg" && leg.leg === "prefill")) {
      return admitted(relay, prefillLeg(relay, plan, leg, opts)).pipe(
        Effect.timeoutOrElse({ duration: legTimeout, orElse: () => Effect.fail(legDeadline("prefill", relay)) })
      )
    }
    return Effect.raceFirst(admitted(relay, engineStream(relay, plan, leg, opts)), decodeDeadline(relay))
  }
  return runLeg
})
