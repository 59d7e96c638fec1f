/**
 * The live EngineHost: runs spawned through the orphan guard (run.ts) and probes over HTTP (probe.ts). The guard
 * program's path comes from the caller (the daemon passes guardEntry, programs/programPaths.ts), so no layer
 * depends on a program.
 */
import { Layer } from "effect"
import { EngineHost } from "../../services/engine/EngineHost.ts"
import { probeOnce } from "./probe.ts"
import { spawnRun } from "./run.ts"

/** The host whose runs are spawned by `node <guardEntry> --grace-ms N -- <engine argv>`. */
export const layer = (guardEntry: string): Layer.Layer<EngineHost> =>
  Layer.succeed(EngineHost, EngineHost.of({ spawn: spawnRun(guardEntry), probe: probeOnce }))
