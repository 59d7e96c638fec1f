/**
 * The retry delay shared by the agent's reconnecting clients (pure): the etcd reporter, the KV bridge's ZMQ bind
 * and kvcached socket, NVML's reopening, the served-context read, the TLS reload's retries (from bases of their
 * own), and the restart of a background loop that died (layers/observability/backgroundFiber.ts). 100 ms (or `baseMs`) doubling per consecutive failure, capped, then jittered to 50-100 %
 * so agents that lost the same peer at the same moment do not come back in lockstep. The engine's restart
 * backoff is a different policy (no jitter, reset after a stable run): see EngineState.ts.
 */

/** Delay after `failures` consecutive failures; `random` in [0, 1) (the caller's RNG, so tests pass fixed values). */
export const jitteredBackoffMs = (failures: number, capMs: number, random: number, baseMs = 100): number =>
  Math.round(Math.min(capMs, baseMs * 2 ** Math.min(40, Math.max(0, failures - 1))) * (0.5 + random / 2))
