/**
 * A warning or an error the simulator logs, as the engine it stands in for writes one: its logger's own prefix, so
 * the agent reads the line's level as it reads the real engine's (layers/engine/backends/logMarks.ts), where the
 * simulator's JSON line read info whatever it said (a P/D soak: vLLM's "Potentially invalid KV blocks" error went
 * unseen at log_level = "warn"). The prefixes: vLLM's `LEVEL MM-DD HH:MM:SS [file.py:line] ` (vllm/logger.py
 * _FORMAT), SGLang's logger's `[YYYY-MM-DD HH:MM:SS] ` with no level (python/sglang/srt/utils/common.py
 * configure_logger), llama.cpp's time since start `M.SS.mmm.uuu` and its letter (common/log.cpp), mlx-lm's
 * `YYYY-MM-DD HH:MM:SS,mmm - LEVEL - ` (mlx_lm/server.py). The line's other fields follow as JSON, for the tests that
 * read them. Pure.
 */
import type { Flavor } from "./simConfig.ts"

export type SimLevel = "warning" | "error"

const two = (n: number) => String(n).padStart(2, "0")

/** `at` in UTC as `YYYY-MM-DD HH:MM:SS`. */
const dateTime = (at: Date) =>
  `${at.getUTCFullYear()}-${two(at.getUTCMonth() + 1)}-${two(at.getUTCDate())} ${two(at.getUTCHours())}:${two(at.getUTCMinutes())}:${two(at.getUTCSeconds())}`

/** llama.cpp's time since start, `M.SS.mmm.uuu`. */
const sinceStart = (us: number) => {
  const total = Math.max(0, Math.floor(us))
  const m = Math.floor(total / 60_000_000)
  const s = Math.floor(total / 1_000_000) % 60
  const ms = Math.floor(total / 1000) % 1000
  return `${m}.${two(s)}.${String(ms).padStart(3, "0")}.${String(total % 1000).padStart(3, "0")}`
}

/** The line, without its newline; `uptimeUs`: the process's time since start, in µs (llama.cpp's prefix). */
export const leveledLine = (
  flavor: Flavor,
  level: SimLevel,
  msg: string,
  fields: Record<string, unknown>,
  at: Date,
  uptimeUs: number
): string => {
  const rest =
    Object.keys(fields).length === 0
      ? ""
      : ` ${JSON.stringify(fields, (_k, v) => (typeof v === "bigint" ? v.toString() : v))}`
  const LEVEL = level.toUpperCase()
  switch (flavor) {
    case "vllm":
      return `${LEVEL} ${dateTime(at).slice(5)} [cgn_engine_sim.py:1] ${msg}${rest}`
    case "sglang":
      return `[${dateTime(at)}] ${msg}${rest}`
    case "llama_cpp":
      return `${sinceStart(uptimeUs)} ${level === "error" ? "E" : "W"} ${msg}${rest}`
    case "mlx":
      return `${dateTime(at)},${String(at.getUTCMilliseconds()).padStart(3, "0")} - ${LEVEL} - ${msg}${rest}`
  }
}
