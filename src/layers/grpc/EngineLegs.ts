/**
 * The engine side of one Generate call: admission, then the leg Handoff.planLeg chose, into the call's Relay.
 * A normal or decode leg streams: EngineClient.streamTo puts each network read straight into the relay (no
 * Effect step per read), and the relay's consumer writes it to the call. A prefill leg is one non-streaming
 * engine call whose handoff parameters (kv_transfer_params only: an SGLang prefill leg returns none) go in the final
 * message. Each P/D leg has [agent].handoff_timeout.
 * Admission gets the call's deadline (the leg's handoff_timeout or the caller's grpc-timeout, the nearer) and learns
 * what calls here need from each one served: a prefill leg's time from its slot to its answer, the others' to their
 * first chunk (services/grpc/ServiceTimes.ts).
 */
import { Clock, Duration, Effect, Option } from "effect"
import { Config } from "../../services/config/Config.ts"
import { complete, EngineClient, type EngineError, type RequestOptions } from "../../services/engine/EngineClient.ts"
import { Admission, type AdmissionError, type CallDeadline } from "../../services/grpc/Admission.ts"
import { LegDeadline } from "../../services/grpc/CallErrors.ts"
import type { RequestPlan } from "../../services/grpc/Generate.ts"
import { extractKvTransferParams, handoffPeer, type InvalidHandoff, type LegPlan } from "../../services/grpc/Handoff.ts"
import { withInputDigest } from "../../services/grpc/InputDigest.ts"
import type { ServiceKind } from "../../services/grpc/ServiceTimes.ts"
import type { Relay } from "./Relay.ts"

type PrefillLeg = Extract<LegPlan, { readonly _tag: "Prefill" }>

/** How the engine side of a call can fail (all of them members of GrpcStatus's GenerateError). */
export type LegError = EngineError | AdmissionError | InvalidHandoff | LegDeadline

/**
 * Runs one call's engine side into `relay`; it ends when the engine answer has been handed to the relay.
 * `callerMs`: what was left of the caller's grpc-timeout, in ms, when the call was handled, if it sent one (a start
 * the pacer delays leaves a little less: admission then sheds a little later, never earlier).
 */
export type RunLeg = (
  relay: Relay,
  plan: RequestPlan,
  leg: LegPlan,
  opts: RequestOptions,
  callerMs?: number | undefined
) => Effect.Effect<void, LegError>

/** The service kind admission measures each leg as (ServiceTimes.ts). */
const KIND: Readonly<Record<LegPlan["_tag"], ServiceKind>> = { Normal: "normal", Prefill: "prefill", Decode: "decode" }

/**
 * The call span's `cgn.leg` (GenerateCall.ts): the names the legs had before LegPlan had one shape (KvTransferPrefill,
 * KvTransferDecode, BootstrapLeg for both SGLang legs), kept so that what reads the agent's traces sees the same.
 */
export const spanLeg = (leg: LegPlan): string =>
  leg._tag === "Normal" ? "Normal" : leg.protocol === "bootstrap" ? "BootstrapLeg" : `KvTransfer${leg._tag}`

const CALLER = "the caller's deadline"

export const make = Effect.fnUntraced(function* () {
  const config = yield* Config
  const client = yield* EngineClient
  const admission = Option.getOrUndefined(yield* Effect.serviceOption(Admission))
  const legTimeout = config.agent.handoff_timeout
  const legMs = Duration.toMillis(legTimeout)
  const legSource = `agent.handoff_timeout = ${Duration.format(legTimeout)}`
  // Read synchronously in the first chunk's callback (no Effect step per read).
  const clock = yield* Clock.clockWith(Effect.succeed)
  const legDeadline = (leg: "prefill" | "decode", relay: Relay) =>
    new LegDeadline({ leg, timeout: Duration.format(legTimeout), queued: !relay.admitted })
  const streamTo = client.streamTo

  // One non-streaming call; its answer is read for finish/usage only (the text comes from the decode leg).
  const prefillLeg = (relay: Relay, plan: RequestPlan, leg: PrefillLeg, opts: RequestOptions) =>
    complete(client, plan.path, leg.body, opts).pipe(
      Effect.flatMap((response) => {
        relay.reader.read(response)
        if (leg.protocol !== "kv_transfer_params") return Effect.void
        return Effect.map(Effect.fromResult(extractKvTransferParams(response)), (params) => {
          // The agent's digest of the leg's input goes with the engine's params: D's agent checks it (InputDigest.ts).
          const digest = leg.inputDigest
          relay.reader.kvTransferParams = digest === undefined ? params : withInputDigest(params, digest)
          relay.handedOffAt = clock.currentTimeMillisUnsafe()
        })
      })
    )

  // From here on the engine is asked for a stream: the stall watchdog counts idle time from now.
  const engineStream = (relay: Relay, plan: RequestPlan, leg: LegPlan, opts: RequestOptions) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      relay.streamRequested(now)
      return streamTo(plan.path, leg.body, opts, relay)
    })

  // A decode leg waits for the KV transfer before its first chunk: that wait is what the deadline bounds.
  const decodeDeadline = (relay: Relay) =>
    Effect.sleep(legTimeout).pipe(
      Effect.andThen(Effect.suspend(() => (relay.started ? Effect.never : Effect.fail(legDeadline("decode", relay)))))
    )

  // The nearer of the leg's handoff_timeout (P/D legs) and the caller's deadline; none: never shed.
  const deadlineOf = (kind: ServiceKind, callerMs: number | undefined): CallDeadline | undefined => {
    if (kind !== "normal" && (callerMs === undefined || legMs <= callerMs))
      return { ms: legMs, kind, source: legSource }
    return callerMs === undefined ? undefined : { ms: callerMs, kind, source: CALLER }
  }

  // What a call needed from its slot, told to admission once it got it: a prefill leg its answer, the others their
  // first chunk (Relay.onFirstChunk: one function for all calls). A call cut off before (its deadline, a cancel)
  // tells nothing (ServiceTimes.ts says why).
  const measure = (kind: ServiceKind) => (relay: Relay) =>
    admission?.observe(kind, clock.currentTimeMillisUnsafe() - relay.slotAt)
  const measured = { prefill: measure("prefill"), decode: measure("decode"), normal: measure("normal") }

  const admitted = (
    relay: Relay,
    kind: ServiceKind,
    deadline: CallDeadline | undefined,
    engineSide: Effect.Effect<void, LegError>
  ): Effect.Effect<void, LegError> => {
    if (admission === undefined) {
      relay.admit()
      return engineSide
    }
    return Effect.scoped(
      Effect.flatMap(deadline === undefined ? admission.acquire : admission.acquireWithin(deadline), (permit) => {
        relay.admit(permit, kind === "prefill" ? undefined : measured[kind])
        return engineSide
      })
    )
  }

  // A P/D leg's deadline counts its wait for admission too: the prefill engine holds the KV blocks, and the
  // router the other leg, for the whole leg, so a leg queued behind busy ones must not get a fresh timeout
  // once admitted.
  const runLeg: RunLeg = (relay, plan, leg, opts, callerMs) => {
    const kind = KIND[leg._tag]
    const deadline = deadlineOf(kind, callerMs)
    if (leg._tag === "Normal") return admitted(relay, kind, deadline, engineStream(relay, plan, leg, opts))
    if (leg._tag === "Prefill") {
      const prefill = Effect.map(prefillLeg(relay, plan, leg, opts), () => measured.prefill(relay))
      return admitted(relay, kind, deadline, prefill).pipe(
        Effect.timeoutOrElse({ duration: legTimeout, orElse: () => Effect.fail(legDeadline("prefill", relay)) })
      )
    }
    relay.readsHandoff = true
    relay.handoffPeer = handoffPeer(leg.body) ?? ""
    return Effect.raceFirst(
      admitted(relay, kind, deadline, engineStream(relay, plan, leg, opts)),
      decodeDeadline(relay)
    )
  }
  return runLeg
})
