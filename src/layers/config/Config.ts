/**
 * Config layers: read a config file and decode it with decodeConfig.ts (which file: programs/configOption.ts,
 * `--config` or CGN_AGENT_CONFIG); the layers only add I/O. Re-exports the decoders, which tests and embedders
 * import from here (a key's printed path, `formatPath`, is services/config/SchemaProblems.ts').
 */
import type { Stats } from "node:fs"
import * as fs from "node:fs/promises"
import { Effect, Layer, Result } from "effect"
import { type AgentConfig, Config, ConfigError } from "../../services/config/Config.ts"
import { decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"

export { decodeConfig, decodeConfigBytes, decodeConfigObject } from "./decodeConfig.ts"

/** A config is a few KiB; far larger is not a config (a log, a model file given by mistake) and is not read in. */
const MAX_CONFIG_BYTES = 1024 * 1024

/** What a path that is not a regular file is, in words. */
const kindOf = (st: Stats): string =>
  st.isDirectory()
    ? "a directory"
    : st.isFIFO()
      ? "a FIFO (named pipe)"
      : st.isSocket()
        ? "a socket"
        : st.isCharacterDevice()
          ? "a character device"
          : st.isBlockDevice()
            ? "a block device"
            : "not a regular file"

/**
 * The file's bytes, or why it is not read: only a regular file (symbolic links followed, as a Kubernetes ConfigMap
 * mounts one) of at most MAX_CONFIG_BYTES. Reading a FIFO with no writer would block in open(2) for ever (a start,
 * `check` or a SIGHUP reload hung with no word), and a device or a huge file would be read without end.
 */
const readConfigBytes = async (file: string): Promise<Buffer | string> => {
  const st = await fs.stat(file)
  if (!st.isFile())
    return `${kindOf(st)}, not a regular file; the config path (--config, else CGN_AGENT_CONFIG) must name a TOML file`
  if (st.size > MAX_CONFIG_BYTES)
    return `the file is ${st.size} bytes, more than a config's ${MAX_CONFIG_BYTES} (1 MiB); is it the right file?`
  return fs.readFile(file)
}

/** Reads and decodes a config file. */
export const loadConfigFile = (file: string): Effect.Effect<AgentConfig, ConfigError> =>
  Effect.tryPromise({
    try: () => readConfigBytes(file),
    catch: (e) => new ConfigError({ file, problems: [`cannot read file: ${(e as Error).message}`] })
  }).pipe(
    Effect.flatMap((read) =>
      typeof read === "string"
        ? Effect.fail(new ConfigError({ file, problems: [`cannot read file: ${read}`] }))
        : Effect.succeed(read)
    ),
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
