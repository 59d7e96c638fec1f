/**
 * The guard's flood sample (Guard.ts), every SAMPLE_MS: each connection's bytes since the last sample stepped through
 * its own bucket (services/grpc/FloodRule.ts floodStep), then each peer's bucket by what its connections still open
 * wasted together (peerFloodStep). The connections either rule names go to `close`.
 */
import type * as http2 from "node:http2"
import {
  answeredBytes,
  type FloodBucket,
  type FloodLimits,
  floodStep,
  fullBucket,
  peerFloodStep,
  refilled,
  wasted
} from "../../../services/grpc/FloodRule.ts"
import { counters } from "./socketCounters.ts"

/** What the sample keeps of a connection between two samples. */
export interface Sampled {
  readonly peer: string
  /** The bytes its calls accounted for since the last sample (the server adds to it). */
  accounted: number
  bucket: FloodBucket
  read: number
  written: number
  /** PING and SETTINGS frames the client sent since the last sample (the agent acked each: not its own writes). */
  pings: number
  settings: number
}

export interface FloodRules {
  readonly connection: FloodLimits
  readonly peer: FloodLimits
}

type Close = (session: http2.Http2Session, peer: string, waste: number) => void

/** One sample at `now` of `sessions`, with the peers' buckets in `peerFlood` (forgotten once full). */
export const sampleFloods = (
  sessions: ReadonlyMap<http2.Http2Session, Sampled>,
  peerFlood: Map<string, FloodBucket>,
  rules: FloodRules,
  now: number,
  close: Close
): void => {
  // The connections that wasted bytes in this sample and are still open, by peer: their waste is the peer's too.
  const wasters = new Map<string, Array<{ readonly session: http2.Http2Session; readonly waste: number }>>()
  for (const [session, f] of sessions) {
    if (session.destroyed) continue
    const c = counters(session)
    if (c === undefined) continue
    const sample = {
      read: c.read - f.read,
      written: c.written - f.written,
      accounted: f.accounted,
      answered: answeredBytes(f.pings, f.settings)
    }
    f.read = c.read
    f.written = c.written
    f.accounted = 0
    f.pings = 0
    f.settings = 0
    const waste = wasted(sample)
    const step = floodStep(f.bucket, sample, now, rules.connection)
    f.bucket = step.bucket
    if (step.flood) close(session, f.peer, waste)
    else if (waste > 0) {
      const peers = wasters.get(f.peer)
      if (peers === undefined) wasters.set(f.peer, [{ session, waste }])
      else peers.push({ session, waste })
    }
  }
  const limits = rules.peer
  for (const [peer, bucket] of peerFlood)
    if (!wasters.has(peer) && refilled(bucket, now, limits) >= limits.burstBytes) peerFlood.delete(peer)
  for (const [peer, connections] of wasters) {
    const step = peerFloodStep(
      peerFlood.get(peer) ?? fullBucket(now, limits),
      connections.map((c) => c.waste),
      now,
      limits
    )
    peerFlood.set(peer, step.bucket)
    for (const i of step.close) {
      const c = connections[i]
      if (c !== undefined) close(c.session, peer, c.waste)
    }
  }
}
