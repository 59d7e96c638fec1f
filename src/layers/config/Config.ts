/**
 * Config layers: read a config file and decode it with decodeConfig.ts (which file: programs/configOption.ts,
 * `--config` or CGN_AGENT_CONFIG); the layers only add I/O. Re-exports the decoders and `formatPath`, which tests,
 * embedders and the engine backends import from here.
 */
import * as fs from "node:fs/promises"
import { Effect, Layer, Result } from "effect"
import { type AgentConfig, Config, ConfigError } from "../../services/config/Config.ts"
import { decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"

export { decodeConfig, decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"
export { formatPath } from "./schemaProblems.ts"

/** Reads and decodes a config file. */
export const loadConfigFile = (file: string): Effect.Effect<AgentConfig, ConfigError> =>
  Effect.tryPromise({
    try: () => fs.readFile(file),
    catch: (e) => new ConfigError({ file, problems: [`cannot read file: ${(e as Error).message}`] })
  }).pipe(
    Effect.flatMap((bytes) =>
      Result.match(decodeConfigBytes(bytes, file), { onFailure: Effect.fail, onSuccess: Effect.succeed })
    )
  )

/** The live layer from a file (for embedders; the daemon loads the file in programs/configOption.ts). */
export const layerFile = (file: string): Layer.Layer<Config, ConfigError> => Layer.effect(Config, loadConfigFile(file))

/** The test layer: a config built from an object, validated exactly like a file. */
export const layerFromObject = (raw: unknown): Layer.Layer<Config, ConfigError> =>
  Layer.effect(
    Config,
    Result.match(decodeConfigObject(raw, undefined), { onFailure: Effect.fail, onSuccess: Effect.succeed })
  )
