/**
 * The live MemoryCgroup: finds the agent's memory cgroup once (/proc/self/cgroup, /proc/self/mountinfo; the pure
 * rules are services/node/MemoryCgroup.ts) and reads its OOM kill count and limit each time it is asked: a run's
 * spawn and end, `cgn-agent check`. It never fails: no cgroup (macOS, a laptop without /proc), an unreadable file
 * or an older kernel's file without the count reads as unknown, said once in the log, not per run.
 */
import * as fs from "node:fs/promises"
import { Effect, Layer, Result } from "effect"
import {
  locateMemoryCgroup,
  MemoryCgroup,
  type MemoryCgroupFiles,
  type MemoryCgroupService,
  NoMemoryCgroup,
  parseMemoryLimit,
  parseOomKills
} from "../../services/node/MemoryCgroup.ts"

const readText = (file: string): Effect.Effect<string, NoMemoryCgroup> =>
  Effect.tryPromise({
    try: () => fs.readFile(file, "utf8"),
    catch: (e) => new NoMemoryCgroup({ reason: `${file}: ${e instanceof Error ? e.message : String(e)}` })
  })

/** Where the agent's memory cgroup's files are (read now); fails with why there is none. */
export const locate: Effect.Effect<MemoryCgroupFiles, NoMemoryCgroup> = Effect.gen(function* () {
  const [cgroup, mountinfo] = yield* Effect.all([readText("/proc/self/cgroup"), readText("/proc/self/mountinfo")])
  return yield* Effect.fromResult(locateMemoryCgroup(cgroup, mountinfo))
})

/** `parse` of `file`'s text; undefined when unreadable or not understood, with `onUnknown` told why. */
const readWith = <A>(
  file: string,
  parse: (text: string) => A | undefined,
  onUnknown: (why: string) => Effect.Effect<void>
): Effect.Effect<A | undefined> =>
  readText(file).pipe(
    Effect.flatMap((text) => {
      const value = parse(text)
      return value === undefined
        ? Effect.as(onUnknown(`${file}: not understood (${JSON.stringify(text.trim().slice(0, 80))})`), undefined)
        : Effect.succeed(value)
    }),
    Effect.catch((e) => Effect.as(onUnknown(e.reason), undefined))
  )

/** The service over found files (`undefined`: none found, every read unknown); `onUnknown` hears each failed read. */
export const fromFiles = (
  files: MemoryCgroupFiles | undefined,
  onUnknown: (why: string) => Effect.Effect<void> = () => Effect.void
): MemoryCgroupService => ({
  version: files?.version,
  oomKills: files === undefined ? Effect.undefined : readWith(files.oomKillsFile, parseOomKills, onUnknown),
  limit: files === undefined ? Effect.undefined : readWith(files.limitFile, parseMemoryLimit, onUnknown)
})

/** Locates the cgroup (no log: `cgn-agent check` prints what it finds itself). */
export const make: Effect.Effect<MemoryCgroupService> = locate.pipe(
  Effect.map((files) => fromFiles(files)),
  Effect.catch(() => Effect.succeed(fromFiles(undefined)))
)

/** The daemon's: says once where the cgroup is (or why there is none) and once that a read failed. */
export const layer: Layer.Layer<MemoryCgroup> = Layer.effect(
  MemoryCgroup,
  Effect.gen(function* () {
    const found = yield* Effect.result(locate)
    if (Result.isFailure(found)) {
      // Expected where there is none (macOS, a laptop): debug only.
      yield* Effect.logDebug(`engine OOM kills will not be reported: ${found.failure.message}`)
      return MemoryCgroup.of(fromFiles(undefined))
    }
    let told = false
    const onUnknown = (why: string) =>
      told
        ? Effect.void
        : Effect.sync(() => {
            told = true
          }).pipe(Effect.andThen(Effect.logInfo(`memory cgroup unreadable, OOM kills unknown: ${why}`)))
    const service = fromFiles(found.success, onUnknown)
    const limit = yield* service.limit
    yield* Effect.logInfo("memory cgroup", {
      cgroup: found.success.version,
      dir: found.success.dir,
      limit: limit === undefined ? "unknown" : limit === "none" ? "none" : `${limit} bytes`
    })
    return MemoryCgroup.of(service)
  }).pipe(Effect.annotateLogs({ component: "MemoryCgroup" }))
)
