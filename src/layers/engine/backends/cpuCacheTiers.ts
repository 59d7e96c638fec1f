/**
 * Where each KV connector's CPU KV-cache tier takes its size from, as data (services/engine/CpuCache.ts). The
 * tiers are pinned host memory allocated whole at start, so the whole size counts against the agent's memory
 * cgroup from the first minute. Pure: no I/O, no `node:*` imports.
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import { type CpuCacheTier, GB, GIB } from "../../../services/engine/CpuCache.ts"
import type { EnvironmentNeed } from "../../../services/engine/EngineEnvironment.ts"

/** Every GPU worker of the engine (tp x dp: one process per GPU) allocates a tier of its own. */
const perWorker = (config: AgentConfig): NonNullable<CpuCacheTier["perWorker"]> => {
  const { tp, dp } = config.model
  return { workers: tp * dp, what: dp > 1 ? `tp ${tp} x dp ${dp}` : `tp ${tp}` }
}

/**
 * KVBM (vLLM): sized by env only (ai-dynamo/dynamo KVBM docs: DYN_KVBM_CPU_CACHE_GB); KVBM's GB is 10^9 bytes, and a
 * block count set instead wins (lib/llm/src/block_manager/distributed/leader.rs compute_num_blocks:
 * cache_size_in_gb * 1_000_000_000.0). Unset: no CPU tier (a disk tier only). Its value is not unquoted (as LMCache's
 * is): lib/bindings/kvbm/src/block_manager/distributed/leader.rs read_cache_size_float parses it as an f64 as it is.
 */
export const kvbmTier: CpuCacheTier = {
  sources: [
    { kind: "env", name: "DYN_KVBM_CPU_CACHE_GB", unit: GB, unlessSet: "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS" }
  ],
  lower: "engine.kvbm_cpu_cache_gb, or the variable in [engine].env"
}

/** KVBM's cache tiers, each set by a size or a block count (leader.rs KvbmLeaderConfig::sanity_check). */
const KVBM_TIER_VARIABLES = [
  "DYN_KVBM_CPU_CACHE_GB",
  "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS",
  "DYN_KVBM_DISK_CACHE_GB",
  "DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS"
] as const

const positive = (v: string | undefined): boolean => v !== undefined && Number(v) > 0

/** Whether the engine's environment gives KVBM a tier: a size or block count > 0, or object storage with blocks. */
export const kvbmHasTier = (env: Readonly<Record<string, string | undefined>>): boolean =>
  KVBM_TIER_VARIABLES.some((name) => positive(env[name])) ||
  (["1", "true"].includes(env.DYN_KVBM_USE_OBJECT_OFFLOAD?.toLowerCase() ?? "") &&
    positive(env.DYN_KVBM_OBJECT_NUM_BLOCKS))

/** KVBM's leader refuses to start with no cache tier: the engine would exit at every start. */
export const kvbmTierNeed: EnvironmentNeed = {
  met: kvbmHasTier,
  problem:
    'engine.kv_offload = "kvbm" with no cache tier: KVBM refuses to start without one ("At least one cache tier must ' +
    'be configured"), so the engine would exit at every start; set engine.kvbm_cpu_cache_gb or ' +
    "engine.kvbm_disk_cache_gb (or DYN_KVBM_CPU_CACHE_GB / DYN_KVBM_DISK_CACHE_GB in [engine].env)"
}

/**
 * LMCache with vLLM's LMCacheConnectorV1 (LMCache/LMCache, read at commit 000620e3 of lmcache/v1/config.py and
 * lmcache/v1/storage_backend/local_cpu_backend.py, 082c5012 of lmcache/v1/config_base.py):
 * - `max_local_cpu_size` (default 5.0) is read from the YAML file LMCACHE_CONFIG_FILE names, then environment
 *   variables override the file's values (config_base.py load_config_with_overrides and create_singleton_config:
 *   from_file, then update_config_from_env), so LMCACHE_MAX_LOCAL_CPU_SIZE wins over the file; neither: the default.
 *   (Older docs say the environment is ignored when a file is set; the code reads both.)
 * - Its unit is GiB: LocalCPUBackend.initialize_allocator allocates int(max_local_cpu_size * 1024**3) bytes as a
 *   MixedMemoryAllocator, whose pinned buffer is allocated in its constructor, whole (the lazy allocator falls back
 *   to it: "LazyMixedMemoryAllocator is temporarily unavailable").
 * - `local_cpu: false` does not shrink it: the LocalCPUBackend and its allocator are made anyway, as the buffer the
 *   other backends go through ("Even if local_cpu is False (the hot_cache is not used) ...").
 * - Every vLLM worker (one per GPU, tp x dp) builds its own LMCacheEngine and so its own buffer
 *   (lmcache/integration/vllm/vllm_v1_adapter.py, commit 0043281d: the worker role's engine). An MLA model's
 *   `save_only_first_rank` may give other ranks less; the count here is the upper bound.
 */
export const lmcacheTier = (config: AgentConfig): CpuCacheTier => ({
  sources: [
    // Unquoted first, as LMCache reads its environment (config_base.py _parse_quoted_string): "5" is 5.
    { kind: "env", name: "LMCACHE_MAX_LOCAL_CPU_SIZE", unit: GIB, unquote: true },
    { kind: "file", variable: "LMCACHE_CONFIG_FILE", key: "max_local_cpu_size", unit: GIB },
    { kind: "default", setting: "LMCache's default max_local_cpu_size of 5 (GiB)", units: 5, unit: GIB }
  ],
  perWorker: perWorker(config),
  lower:
    "LMCACHE_MAX_LOCAL_CPU_SIZE (GiB per GPU worker) in [engine].env, which wins over the max_local_cpu_size of a " +
    "LMCACHE_CONFIG_FILE"
})

/**
 * SGLang HiCache (sgl-project/sglang python/sglang/srt/server_args.py: `--hicache-size`, int, default 0, "The size
 * of host KV cache memory pool in gigabytes, which will override the hicache_ratio if set"; the host pool:
 * python/sglang/srt/mem_cache/memory_pool_host.py, since moved to mem_cache/pool_host/base.py, HostKVCache:
 * host_size * 1e9 bytes when `host_size > 0`, else device_pool.size * hicache_ratio, so any size at or below 0, -1
 * too, leaves it to the ratio; allocated pinned at start). Each
 * scheduler process (one per GPU, tp x dp) holds its own host pool. Without a size, the pool is a multiple of the
 * GPU KV pool, which SGLang sizes at start from free GPU memory: not known before.
 */
export const hicacheTier = (config: AgentConfig): CpuCacheTier => ({
  sources: [
    { kind: "flag", flag: "--hicache-size", unit: GB, unsetAtOrBelow: 0 },
    {
      kind: "unknown",
      why:
        "SGLang sizes its host pool as --hicache-ratio times its GPU KV pool, known only once it has started " +
        "(--hicache-size N in engine.args sizes it in GB per GPU worker instead)"
    }
  ],
  perWorker: perWorker(config),
  lower: "--hicache-size (GB per GPU worker) in engine.args"
})

/**
 * SGLang's `--enable-lmcache`: deliberately not sized. Newer SGLang runs LMCache in MP mode, where a separate
 * `lmcache server` (its own --l1-size-gb) holds the CPU store, older SGLang in process (sgl-project/sglang
 * python/sglang/srt/mem_cache/storage/lmcache/README.md and lmc_radix_cache.py, `_mode`): which one runs is not known
 * from the config. Said as unknown, so that `check` and the start say it is not checked rather than that there is none.
 */
export const sglangLmcacheTier: CpuCacheTier = {
  sources: [
    {
      kind: "unknown",
      why:
        "SGLang's LMCache is not sized here: newer SGLang keeps its CPU store in a separate `lmcache server` " +
        "(--l1-size-gb), older SGLang in the engine (LMCACHE_MAX_LOCAL_CPU_SIZE, GiB per GPU worker)"
    }
  ],
  lower: "the LMCache store's own size (the lmcache server's --l1-size-gb, or LMCACHE_MAX_LOCAL_CPU_SIZE)"
}
