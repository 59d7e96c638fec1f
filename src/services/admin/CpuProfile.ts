/**
 * CpuProfile: the pure parts of the admin server's on-demand CPU profile (`POST /debug/cpu-profile`, taken in
 * layers/admin/cpuProfile.ts): which query it accepts and the name of the file it answers with.
 */
import { Result } from "effect"

export const CPU_PROFILE_PATH = "/debug/cpu-profile"

/** Long enough to see a steady load, short enough that one request cannot keep the profiler on for long. */
export const DEFAULT_SECONDS = 10
export const MAX_SECONDS = 60

/**
 * `?interval_us=` bounds. Unset, V8's own default applies (`cpu_profiler_sampling_interval`, 1000 µs:
 * v8/src/flags/flag-definitions.h). Below 100 µs the sampler's signal and stack walk per sample grow into a
 * visible share of a busy main thread (and a larger profile); above 10 ms a short profile has too few samples
 * to show anything.
 */
export const MIN_INTERVAL_US = 100
export const MAX_INTERVAL_US = 10_000

export interface CpuProfileRequest {
  readonly seconds: number
  /** The sampling interval to ask V8 for, µs; undefined: V8's default. */
  readonly intervalUs: number | undefined
}

const KNOWN = new Set(["seconds", "interval_us"])

const integerIn = (
  params: URLSearchParams,
  name: string,
  min: number,
  max: number
): Result.Result<number | undefined, string> => {
  const values = params.getAll(name)
  if (values.length === 0) return Result.succeed(undefined)
  if (values.length > 1) return Result.fail(`${name} given ${values.length} times; give it once`)
  const text = values[0]!
  // digits only: Number() would take "", " 5", "1e1" and "0x10"
  const n = /^\d{1,9}$/.test(text) ? Number(text) : Number.NaN
  return n >= min && n <= max
    ? Result.succeed(n)
    : Result.fail(`${name} must be a whole number from ${min} to ${max}, got ${JSON.stringify(text)}`)
}

/**
 * The query of `POST /debug/cpu-profile` (`seconds`, `interval_us`; the `?` optional); fails with why. An unknown
 * parameter is refused rather than ignored: `?second=30` must not quietly profile for the default 10 s.
 */
export const parseCpuProfileQuery = (search: string): Result.Result<CpuProfileRequest, string> => {
  const params = new URLSearchParams(search)
  const unknown = [...new Set(params.keys())].filter((k) => !KNOWN.has(k))
  if (unknown.length > 0) {
    return Result.fail(
      `unknown query parameter ${unknown.map((k) => JSON.stringify(k)).join(", ")}; use seconds, interval_us`
    )
  }
  const seconds = integerIn(params, "seconds", 1, MAX_SECONDS)
  if (Result.isFailure(seconds)) return Result.fail(seconds.failure)
  const interval = integerIn(params, "interval_us", MIN_INTERVAL_US, MAX_INTERVAL_US)
  if (Result.isFailure(interval)) return Result.fail(interval.failure)
  return Result.succeed({ seconds: seconds.success ?? DEFAULT_SECONDS, intervalUs: interval.success })
}

/** `20250102T030405Z`: sorts by time, and no `:` (which some file systems and tools refuse in names). */
const compactUtc = (epochMillis: number): string =>
  new Date(epochMillis)
    .toISOString()
    .replace(/\.\d{3}Z$/, "Z")
    .replace(/[-:]/g, "")

/**
 * `cgn-agent-<node>-<UTC time>.cpuprofile` (the extension Chrome DevTools and speedscope open). node_id already
 * excludes `/` and control characters; anything else that would need quoting in Content-Disposition, or is not
 * ASCII, becomes `_`.
 */
export const cpuProfileFileName = (nodeId: string, epochMillis: number): string =>
  `cgn-agent-${nodeId.replace(/[^A-Za-z0-9._-]/g, "_")}-${compactUtc(epochMillis)}.cpuprofile`

/** The Content-Disposition header that makes a browser or `curl -OJ` save the profile under its name. */
export const cpuProfileDisposition = (fileName: string): string => `attachment; filename="${fileName}"`
