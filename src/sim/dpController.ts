// SGLang's data parallelism without --enable-dp-attention (`--dp-size N`): the tokenizer manager hands every
// tokenized request to one DataParallelController process, which launches N scheduler replicas, each with a
// whole TP group, its own scheduler, KV pool and radix cache, and pushes each request to one of them by
// `--load-balance-method` (sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py,
// DataParallelController.launch_dp_schedulers and its `*_scheduler` dispatchers). Pure: no I/O.
//
// What differs from vLLM's DP (ranks.ts): no coordinator and no load score for the default method; a
// replica's `--max-running-requests` is its own (the limit is divided by dp_size only under
// --enable-dp-attention: python/sglang/srt/model_executor/model_runner.py, `max_running_requests //
// (dp_size if enable_dp_attention else 1)`), and its KV-event hashes do not depend on the process
// (python/sglang/srt/mem_cache/utils.py, hash_str_to_int64 over sha256 page hashes), so every replica hashes
// a prompt alike.
import type { Balancer, PickHint, Rank } from "./ranks.ts"
import { ArgsError } from "./simConfig.ts"

/**
 * `--load-balance-method`'s argparse choices and default "auto" (python/sglang/srt/server_args.py,
 * ServerArgs.load_balance_method). Older releases offered round_robin, shortest_queue and minimum_tokens;
 * current ones replaced the last two with total_requests and total_tokens and added auto.
 */
export const LOAD_BALANCE_METHODS = [
  "auto",
  "round_robin",
  "follow_bootstrap_room",
  "total_requests",
  "total_tokens"
] as const

/** A method after ServerArgs resolved "auto". */
export type LoadBalanceMethod = Exclude<(typeof LOAD_BALANCE_METHODS)[number], "auto">

/** Python's repr() of a str, as argparse quotes values in its messages. */
const pyRepr = (s: string): string =>
  s.includes("'") && !s.includes('"') ? `"${s}"` : `'${s.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`

/**
 * The method a server runs with: argparse refuses a value outside the choices (exit 2, `argument
 * --load-balance-method: invalid choice: ...`), then ServerArgs._handle_load_balance_method resolves "auto"
 * to follow_bootstrap_room on a PD prefill server and round_robin elsewhere, and on a prefill server
 * takes a legacy round_robin for follow_bootstrap_room too (python/sglang/srt/server_args.py).
 */
export const resolveLoadBalanceMethod = (
  value: string | undefined,
  disaggregationMode: string | undefined
): LoadBalanceMethod => {
  const v = value ?? "auto"
  const method = LOAD_BALANCE_METHODS.find((m) => m === v)
  if (method === undefined) {
    const choices = LOAD_BALANCE_METHODS.map(pyRepr).join(", ")
    throw new ArgsError(`argument --load-balance-method: invalid choice: ${pyRepr(v)} (choose from ${choices})`)
  }
  const prefill = disaggregationMode === "prefill"
  if (method === "auto") return prefill ? "follow_bootstrap_room" : "round_robin"
  return prefill && method === "round_robin" ? "follow_bootstrap_room" : method
}

/**
 * Methods the simulator routes as their upstream dispatcher does. total_requests and total_tokens score the
 * schedulers' load reports (DPBudget), whose bookkeeping still changes from release to release (snapshots
 * refreshed at most every 20 ms, speculative increments, acknowledged dispatches): the simulator routes them
 * round robin and says so at start.
 */
export const MODELLED_METHODS: ReadonlySet<LoadBalanceMethod> = new Set(["round_robin", "follow_bootstrap_room"])

/**
 * The controller's dispatch for one request. round_robin: `workers[round_robin_counter]`, the counter
 * advancing by one per request whatever the replicas' load, from 0 at start. follow_bootstrap_room:
 * `bootstrap_room % len(workers)`, so a PD prefill replica is found again from the room alone. A request
 * naming its replica (`routed_dp_rank`, dpPin.ts) goes there before any of this, the counter left as it was
 * (maybe_external_dp_rank_routing): Engines.pick never asks the balancer for it.
 */
export class SglangDpController implements Balancer {
  readonly method: LoadBalanceMethod
  private counter = 0

  constructor(method: LoadBalanceMethod) {
    this.method = method
  }

  pick(ranks: ReadonlyArray<Rank>, hint: PickHint): number {
    const n = ranks.length
    // Upstream asserts bootstrap_room is set; the prefill leg refuses a request without the bootstrap
    // fields before it gets here (pdLegs.ts), so a missing room cannot reach this branch.
    if (this.method === "follow_bootstrap_room" && hint.bootstrapRoom !== undefined)
      return Number(BigInt(hint.bootstrapRoom) % BigInt(n))
    const chosen = this.counter % n
    this.counter = (this.counter + 1) % n
    return chosen
  }
}
