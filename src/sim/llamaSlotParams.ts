// What of a request's sampling fields llama-server keeps in its task's params (pure), so that GET /slots (and a
// `__verbose` answer's generation_settings) show a task's params as the real server does: the values the schema read
// (tools/server/server-schema.cpp make_llama_cmpl_schema: each field_num converted to its C++ type, then clamped to
// its set_limits), on the server's defaults, written by task_params::to_json (tools/server/server-task.cpp) under
// these keys. Measured against the real binary (test/real/sim-differential-13.test.ts): before this the simulator
// showed the defaults whatever the request set (a temperature of 0.3 shown as 0.800000011920929).
import { chainOf } from "./llamaGreedy.ts"

/** Fields shown under their own name, read by field_num or field_bool (their value as the schema converted it). */
const SHOWN = [
  "temperature",
  "dynatemp_range",
  "dynatemp_exponent",
  "top_k",
  "top_p",
  "min_p",
  "top_n_sigma",
  "xtc_probability",
  "xtc_threshold",
  "typical_p",
  "repeat_last_n",
  "repeat_penalty",
  "presence_penalty",
  "frequency_penalty",
  "dry_multiplier",
  "dry_base",
  "dry_allowed_length",
  "dry_penalty_last_n",
  "mirostat",
  "mirostat_tau",
  "mirostat_eta",
  "adaptive_target",
  "adaptive_decay",
  "n_keep",
  "n_discard",
  "min_keep",
  "backend_sampling"
]

/** common/sampling.cpp common_sampler_type_to_str, by the letter llamaGreedy.ts's chain uses. */
const SAMPLER_NAMES: Record<string, string> = {
  d: "dry",
  k: "top_k",
  y: "typ_p",
  p: "top_p",
  s: "top_n_sigma",
  m: "min_p",
  t: "temperature",
  x: "xtc",
  i: "infill",
  e: "penalties",
  a: "adaptive_p"
}

/** common/common.h common_params_sampling::dry_base, which the dry_base handler puts back for a value below 1. */
const DRY_BASE_DEFAULT = 1.75

/** common_reasoning_format_name of what common_reasoning_format_from_name read (common/chat.cpp). */
const REASONING_NAMES = new Set(["none", "auto", "deepseek", "deepseek-legacy"])

/**
 * The params a request's task shows beyond the defaults: `values` as llamaRequest.ts read them (the field's first
 * name), `body` the request (samplers and reasoning_format, read by handlers of their own).
 */
export const shownParams = (
  values: ReadonlyMap<string, unknown>,
  body: Record<string, unknown>,
  stream: boolean
): Record<string, unknown> => {
  const out: Record<string, unknown> = {}
  for (const k of SHOWN) if (values.has(k)) out[k] = values.get(k)
  // the dry_base handler: `(v < 1.0f) ? params_base.sampling.dry_base : v`
  if (typeof out.dry_base === "number" && out.dry_base < 1) out.dry_base = DRY_BASE_DEFAULT
  // the samplers handler: an array of names or a string of letters (unknown ones skipped); another type is ignored
  const s = body.samplers
  if (Array.isArray(s) || typeof s === "string") out.samplers = [...chainOf(s)].map((c) => SAMPLER_NAMES[c])
  const rf = body.reasoning_format
  if (typeof rf === "string" && REASONING_NAMES.has(rf)) {
    out.reasoning_format = rf
    // the handler's, and eval_llama_cmpl_schema's post-processing: reasoning in the content for a stream only
    out.reasoning_in_content = stream && rf === "deepseek-legacy"
  }
  return out
}
