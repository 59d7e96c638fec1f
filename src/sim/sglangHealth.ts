// SGLang's `/health` and `/health_generate`: one handler, `health_generate` (sgl-project/sglang
// python/sglang/srt/entrypoints/http_server.py). 503 while the server is Starting (loading, warm-up); once it is up,
// it submits a 1-token generation (rid HEALTH_CHECK_..., input_ids [0]) and looks once a second whether the
// detokenizer sent anything since it began: any request's output, or the scheduler's own answer to the health
// request (a busy scheduler answers it without running it: python/sglang/srt/managers/scheduler.py,
// return_health_check_ct). 200 then; 503 once `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s) passed with nothing. So every
// answer takes a second at the least, and a wedged scheduler's takes the timeout. `/health` skips the generation
// (a bare 200) only with `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION` false (python/sglang/srt/environ.py, default
// true); older SGLang had a bare `/health` always, not modelled. One data-parallel rank wedged alone is not seen
// here (upstream: only when the health request lands on it while no other rank sends output).
import type * as http from "node:http"
import { ArgsError } from "./simConfig.ts"

export interface SglangHealth {
  /** Whether `/health` runs the generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION). */
  readonly generation: boolean
  /** SGLANG_HEALTH_CHECK_TIMEOUT, in ms. */
  readonly timeoutMs: number
}

/** sglang's EnvBool: true/1/yes/y and false/0/no/n, any case (python/sglang/srt/environ.py). */
const envBool = (name: string, value: string | undefined, fallback: boolean): boolean => {
  if (value === undefined) return fallback
  const v = value.toLowerCase()
  if (["true", "1", "yes", "y"].includes(v)) return true
  if (["false", "0", "no", "n"].includes(v)) return false
  throw new ArgsError(`${name}: ${JSON.stringify(value)} is not a boolean`)
}

export const sglangHealthOf = (env: Record<string, string | undefined>): SglangHealth => {
  const seconds = Number(env.SGLANG_HEALTH_CHECK_TIMEOUT ?? "20")
  if (!Number.isFinite(seconds) || seconds < 0)
    throw new ArgsError("SGLANG_HEALTH_CHECK_TIMEOUT: not a number of seconds")
  return {
    generation: envBool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", env.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, true),
    timeoutMs: seconds * 1000
  }
}

/**
 * Answers an SGLang health request of a server that is up; `scheduler.runs` says whether its scheduler answers,
 * `scheduler.generated` is told of each check it answered.
 */
export const sglangHealth = (
  cfg: SglangHealth,
  path: string,
  scheduler: { readonly runs: () => boolean; readonly generated: () => void },
  res: http.ServerResponse
): void => {
  const answer = (status: number) => {
    res.writeHead(status, { "content-length": 0 })
    res.end()
  }
  if (!cfg.generation && path === "/health") return void answer(200)
  const tic = Date.now()
  const poll = setInterval(() => {
    if (scheduler.runs()) {
      scheduler.generated()
      answer(200)
    } else if (Date.now() < tic + cfg.timeoutMs) return
    else answer(503)
    clearInterval(poll)
  }, 1_000)
  poll.unref()
  res.on("close", () => clearInterval(poll))
}
