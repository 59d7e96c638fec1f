/**
 * Config layers: find the file (`--config` or CGN_AGENT_CONFIG), read it and decode it with
 * decodeConfig.ts; the layers only add I/O. Re-exports the decoders and `formatPath`, which tests,
 * embedders and the engine backends import from here.
 */
import * as fs from "node:fs/promises"
import { Effect, Layer, Result } from "effect"
import { type AgentConfig, Config, ConfigError } from "../../services/config/Config.ts"
import { decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"

export { decodeConfig, decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"
export { formatPath } from "./schemaProblems.ts"

/** Where the config file is: `--config PATH` in argv, else CGN_AGENT_CONFIG. */
export const configPathFrom = (
  argv: ReadonlyArray<string>,
  env: Readonly<Record<string, string | undefined>>
): string | undefined => {
  const i = argv.indexOf("--config")
  if (i >= 0 && argv[i + 1] !== undefined) return argv[i + 1]
  const eq = argv.find((a) => a.startsWith("--config="))
  if (eq !== undefined) return eq.slice("--config=".length)
  return env.CGN_AGENT_CONFIG || undefined
}

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

/** The live layer: the file named by `--config` or CGN_AGENT_CONFIG. */
export const layerFile = (file: string): Layer.Layer<Config, ConfigError> => Layer.effect(Config, loadConfigFile(file))

/** The test layer: a config built from an object, validated exactly like a file. */
export const layerFromObject = (raw: unknown): Layer.Layer<Config, ConfigError> =>
  Layer.effect(
    Config,
    Result.match(decodeConfigObject(raw, undefined), { onFailure: Effect.fail, onSuccess: Effect.succeed })
  )
