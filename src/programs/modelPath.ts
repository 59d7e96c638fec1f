/**
 * `cgn-agent check`'s look at `models."name".path` (hostChecks.ts): what each spawned engine does with the path its
 * backend passes it (layers/engine/backends/*.ts render; `capabilities.modelPath` says which of these it is), so that a model that is not there is found before `run`
 * spawns an engine that exits at every start (the crash loop of a missing GGUF file). Reads only.
 * - llama.cpp: `llama-server -m PATH` opens one GGUF file (ggml-org/llama.cpp ggml/src/gguf.cpp gguf_init_from_file:
 *   "failed to open GGUF file"), and refuses one that does not start with its magic (gguf_init_from_reader: "invalid
 *   magic characters"), whatever its name.
 * - vLLM (`vllm serve PATH`) and SGLang (`--model-path PATH`): a model directory (the Hugging Face layout), or one
 *   GGUF file, told by its name or its magic (vllm-project/vllm vllm/transformers_utils/utils.py and
 *   sgl-project/sglang python/sglang/srt/utils.py, check_gguf_file: a file named *.gguf or starting with "GGUF"). A
 *   path that does not exist is asked of the Hugging Face Hub as a repo id, and the engine exits (transformers
 *   cached_files: "is not a local folder and is not a valid model identifier").
 * - mlx: `mlx_lm.server --model PATH`: a model directory, else a Hub repo id (ml-explore/mlx-lm mlx_lm/utils.py
 *   get_model_path).
 */
import { constants } from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { engineOf } from "../layers/engine/backends/index.ts"
import type { AgentConfig } from "../services/config/Config.ts"
import { formatPath } from "../services/config/SchemaProblems.ts"
import type { ModelPathKind } from "../services/engine/Engine.ts"

const WHAT: Record<ModelPathKind, string> = {
  "gguf-file": "an existing, readable GGUF file",
  "directory-or-gguf": "an existing, readable model directory (or one GGUF file)",
  directory: "an existing, readable model directory"
}

/** A failed filesystem call's errno name (ENOENT, EACCES), else the error as text. */
export const codeOf = (e: unknown): string => (e as NodeJS.ErrnoException).code ?? String(e)

/** Whether `file` starts with GGUF's magic (check_gguf_file reads the first 4 bytes). */
const ggufMagic = async (file: string): Promise<boolean> => {
  const handle = await fsp.open(file, "r")
  try {
    const { buffer, bytesRead } = await handle.read(Buffer.alloc(4), 0, 4, 0)
    return bytesRead === 4 && buffer.toString("latin1") === "GGUF"
  } finally {
    await handle.close()
  }
}

/** Why `file` (resolved) is not what `wanted` asks for, or undefined when it is. */
export const pathProblem = async (file: string, wanted: ModelPathKind): Promise<string | undefined> => {
  try {
    const st = await fsp.stat(file)
    if (st.isDirectory()) {
      if (wanted === "gguf-file") return `${file} is a directory, not a file`
      await fsp.access(file, constants.R_OK | constants.X_OK)
      return undefined
    }
    if (!st.isFile()) return `${file} is neither a file nor a directory`
    if (wanted === "directory") return `${file} is a file, not a model directory`
    await fsp.access(file, constants.R_OK)
    if (wanted === "directory-or-gguf" && !file.endsWith(".gguf") && !(await ggufMagic(file)))
      return `${file} is a file but not a GGUF file (a model directory is wanted)`
    // llama-server reads the magic first, whatever the name (gguf_init_from_reader: "invalid magic characters")
    if (wanted === "gguf-file" && !(await ggufMagic(file)))
      return `${file} is not a GGUF file (it does not start with "GGUF")`
    return undefined
  } catch (e) {
    const code = codeOf(e)
    if (code === "ENOENT" || code === "ENOTDIR") return `${file} does not exist`
    if (code === "EACCES") return `${file} is not readable`
    return `${file}: ${code}`
  }
}

/**
 * The finding for the configured model's `path` on this host, or undefined (a Hub repo, a proxied server, a path that
 * is fine). `hosted`: whether a missing path is an error; with `engine.command` set the engine may run where the path
 * is another one's (a container with the model mounted), so it is a warning then.
 */
export const modelPathFinding = async (
  c: AgentConfig,
  cwd: string
): Promise<{ readonly line: string; readonly error: boolean } | undefined> => {
  const { modelPath: wanted, displayName } = engineOf(c).capabilities
  if (c.model.source.kind !== "path" || wanted === undefined) return undefined
  const given = c.model.source.value
  const problem = await pathProblem(path.resolve(cwd, given), wanted)
  if (problem === undefined) return undefined
  const key = `${formatPath(["models", c.model.name, "path"])} = "${given}"`
  const line = `${key}: ${problem}; ${displayName} needs ${WHAT[wanted]} on this host and would exit at every start`
  return c.engine.command === undefined
    ? { line, error: true }
    : { line: `${line}, unless engine.command runs it where that path is another (a container)`, error: false }
}
