// Whether llama-server's sampler chain leaves one candidate at every step, whatever the model's logits (pure): then
// the same prompt gives the same text, as greedy decoding does (generate.ts seeds such a request's words by its
// prompt). Measured against the real server with the tiny random-weight model (test/real/sim-differential-11.test.ts).
// Sources (ggml-org/llama.cpp): common/sampling.cpp common_sampler_init (the chain, :340-406), common/common.h
// common_params_sampling (its defaults, :229-271), src/llama-sampler.cpp (each sampler, lines below).
import { N_VOCAB } from "./tokens.ts"

/**
 * A temperature at or below this is taken as greedy though above 0. The dist sampler draws from expf((l - l_max) / t)
 * (ggml-org/llama.cpp src/llama-sampler.cpp:265 llama_sampler_temp_impl divides the logits by t, then
 * llama_sampler_softmax_impl's expf, :311), and expf of anything below about -104 is 0 in single precision: at
 * t = 1e-6 only a token within 1e-4 of the top logit can still be drawn, a near tie, which the simulator (it has no
 * logits) takes as none.
 */
export const GREEDY_TEMPERATURE = 1e-6

/** common/common.h:261 common_params_sampling::samplers, by letter (common/sampling.cpp:795 its _type_to_chr). */
const DEFAULT_CHAIN = "edskypmxt"

/** common/sampling.cpp:829 common_sampler_types_from_names: canonical names, kebab-case, no-dash forms, 3 aliases. */
const NAMES: Record<string, string> = {
  dry: "d",
  top_k: "k",
  top_p: "p",
  top_n_sigma: "s",
  typ_p: "y",
  min_p: "m",
  temperature: "t",
  xtc: "x",
  infill: "i",
  penalties: "e",
  adaptive_p: "a",
  nucleus: "p",
  temp: "t",
  typ: "y"
}
const letterOf = (name: string): string | undefined => {
  const n = name.toLowerCase()
  return (
    NAMES[n] ??
    Object.entries(NAMES).find(([k]) => k.includes("_") && [k.replace(/_/g, "-"), k.replace(/_/g, "")].includes(n))?.[1]
  )
}

/**
 * The chain a request runs: its own `samplers` (tools/server/server-schema.cpp:501: an array of names, or a string of
 * letters; unknown ones skipped), else the default.
 */
export const chainOf = (samplers: unknown): string =>
  Array.isArray(samplers)
    ? samplers.map((s) => (typeof s === "string" ? (letterOf(s) ?? "") : "")).join("")
    : typeof samplers === "string"
      ? [...samplers].filter((c) => "dkypsmtxiea".includes(c)).join("")
      : DEFAULT_CHAIN

/** The request's values as llamaRequest.ts read them (the field's first name), and the raw body. */
export const llamaGreedy = (values: ReadonlyMap<string, unknown>, body: Record<string, unknown>): boolean => {
  const get = (name: string, dflt: number) => (values.get(name) as number | undefined) ?? dflt
  const temperature = get("temperature", 0.8)
  // Under mirostat the chain is a plain temperature (no dynamic range) and the mirostat sampler (common/sampling.cpp
  // common_sampler_init): one candidate once the temperature leaves one.
  if (get("mirostat", 0) !== 0) return temperature <= GREEDY_TEMPERATURE
  const minKeep = get("min_keep", 0)
  // Candidates left, through the chain; the others do not narrow them whatever the logits.
  let n = N_VOCAB
  for (const s of chainOf(body.samplers)) {
    const topK = get("top_k", 40)
    // llama_sampler_top_k_impl (:321): k of them (none cut at k <= 0)
    if (s === "k" && topK > 0) n = Math.min(n, topK)
    // llama_sampler_top_p_apply (:1549) keeps tokens until their probabilities (a softmax over those left) sum to p
    // (`cum_sum >= ctx->p`, :1582), min_keep at least: the top one alone whenever p is at most 1 / n, which its
    // probability never falls below (in single precision, as the sampler sums: 0.025 of 40)
    if (s === "p" && minKeep <= 1 && Math.fround(get("top_p", 0.95) * n) <= 1) n = 1
    // llama_sampler_min_p_apply (:1749) keeps the tokens whose logit is at least the top one's + log(p): at p >= 1,
    // the top one alone
    if (s === "m" && minKeep <= 1 && get("min_p", 0.05) >= 1) n = 1
    // llama_sampler_temp_ext_apply (:2133): a dynamic range (dynatemp_range > 0) scales by the candidates' entropy
    // instead, above 0 while several are left; else llama_sampler_temp_impl, which keeps the top logit alone at <= 0
    if (s === "t" && get("dynatemp_range", 0) <= 0 && temperature <= GREEDY_TEMPERATURE) n = 1
  }
  return n === 1
}
