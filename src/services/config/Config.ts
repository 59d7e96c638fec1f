/**
 * Config: the one typed, immutable configuration of the agent, resolved from the TOML file.
 * Owns the resolved shape (defaults applied, the single model picked, node id filled in) and its error.
 * Parsing and validation are in layers/config/decodeConfig.ts; every other service reads only this.
 */
import { Context, type Duration, Schema } from "effect"
import type { ConfigFile, EngineKind, KvOffload, Role } from "./ConfigSchema.ts"

export type { EngineKind, KvOffload, ProxiedKind, Role } from "./ConfigSchema.ts"

/** The served model ([models."name"]). Exactly one per agent in this version. */
export interface ModelConfig {
  /** The table's name in `[models."name"]`. */
  readonly name: string
  /** Where the weights come from: an HF repo id or a local path. */
  readonly source: { readonly kind: "hf_repo" | "path"; readonly value: string }
  readonly tp: number
  /** Data-parallel engine replicas (vLLM `--data-parallel-size`, SGLang `--dp-size`). */
  readonly dp: number
  /** The name clients use; defaults to the table's name. */
  readonly served_name: string
  readonly max_model_len: number | undefined
  readonly gpu_memory_utilization: number | undefined
  readonly args: ReadonlyArray<string>
  /** NVML indices or UUIDs the engine is given; empty: the first tp x dp healthy GPUs at start. */
  readonly gpus: ReadonlyArray<number | string>
}

type Section<K extends keyof ConfigFile> = ConfigFile[K]

export interface AgentSettings extends Omit<Section<"agent">, "node_id" | "lease_ttl" | "role"> {
  readonly node_id: string
  /**
   * This host's address from `NODE_IP` (Kubernetes' downward API, status.hostIP), read once with the config:
   * the advertised gRPC host and vLLM's NIXL side-channel host where the file sets neither.
   */
  readonly node_ip?: string | undefined
  readonly lease_ttl: Duration.Duration
  readonly role: Role
}

export interface EngineSettings extends Omit<Section<"engine">, "kind" | "kv_offload"> {
  readonly kind: EngineKind
  readonly kv_offload: KvOffload
}

/** The resolved configuration. */
export interface AgentConfig {
  /** The file it came from, or undefined when built from an object (tests, embedding). */
  readonly file: string | undefined
  readonly cluster: Section<"cluster">
  readonly security: Section<"security">
  readonly agent: AgentSettings
  readonly engine: EngineSettings
  readonly model: ModelConfig
  readonly kv: Section<"kv">
}

/** A config that cannot be used: one line per problem, each naming the key path. */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  file: Schema.String,
  problems: Schema.Array(Schema.String)
}) {
  override get message(): string {
    return `invalid config ${this.file}:\n${this.problems.map((p) => `  ${p}`).join("\n")}`
  }
}

/** The Config service: the resolved configuration, immutable for the life of the process. */
export class Config extends Context.Service<Config, AgentConfig>()("cgn-agent/Config") {}
