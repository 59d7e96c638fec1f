/**
 * What the engine backends' exit-hint tables (LaunchPlan.exitHints) share: the served model's config keys, spelled
 * as the agent's own error messages spell them, and the Hugging Face Hub's refusals, which vLLM and SGLang both
 * print through huggingface_hub and transformers. Each pattern is a line the upstream code prints, cited where it
 * is written. Pure.
 */
import type { AgentConfig } from "../../../services/config/Config.ts"
import { formatPath } from "../../../services/config/SchemaProblems.ts"
import type { ExitHint } from "../../../services/engine/Engine.ts"

/** `models."name".key` of the configured model. */
export const modelKey = (config: AgentConfig, key: string): string => formatPath(["models", config.model.name, key])

/** The key the weights come from: `models."name".hf_repo` or `models."name".path`. */
export const sourceKey = (config: AgentConfig): string => modelKey(config, config.model.source.kind)

/**
 * The Hub's refusals as the Python engines print them:
 * - huggingface/huggingface_hub src/huggingface_hub/utils/_http.py, hf_raise_for_status: GatedRepoError "Cannot
 *   access gated repo for url ..." and RepositoryNotFoundError "Repository Not Found for url: ..." (also what the
 *   Hub answers, 401, for a private or gated repo asked without a token);
 * - huggingface/transformers src/transformers/utils/hub.py, cached_files, which wraps them: "You are trying to access
 *   a gated repo." and "... is not a local folder and is not a valid model identifier listed on
 *   'https://huggingface.co/models'" (a local path that does not exist is looked up on the Hub as a repo id).
 */
export const HUB_REFUSALS: ReadonlyArray<string> = [
  "Cannot access gated repo for url",
  "Repository Not Found for url",
  "You are trying to access a gated repo",
  "is not a local folder and is not a valid model identifier"
]

/** The fix for a model the engine could not fetch or find, by where the config says the weights come from. */
export const hubHint = (config: AgentConfig, patterns: ReadonlyArray<string>): ExitHint => ({
  patterns,
  hint:
    config.model.source.kind === "hf_repo"
      ? `the Hugging Face Hub refused ${sourceKey(config)}: a gated or private repo needs a token with access to it ` +
        "(HF_TOKEN in [engine].env, its account granted access on the model's page); otherwise check the repo id"
      : `${sourceKey(config)} is not a model directory on this host (the engine then asked the Hugging Face Hub ` +
        "for it as a repo id): check the path"
})

/** torch.OutOfMemoryError's message (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc). */
export const TORCH_CUDA_OOM = "CUDA out of memory"

/** `(now X)` when the config sets the value, for a hint that asks to raise or lower it. */
export const nowValue = (value: number | undefined): string => (value === undefined ? "" : ` (now ${value})`)

/**
 * The engine refused its command line before loading anything: a flag this version does not know, or a value it does
 * not take. Python's argparse (vLLM's FlexibleArgumentParser, SGLang's and mlx-lm's parsers) ends with "PROG: error:
 * unrecognized arguments: ..." or "PROG: error: argument --x: invalid choice: ..." and exits 2 (cpython
 * Lib/argparse.py, ArgumentParser.error); llama-server prints "error: invalid argument: --x" or "error while handling
 * argument \"-c\": ..." and exits 1 (ggml-org/llama.cpp common/arg.cpp, common_params_parse; measured against the
 * real server of test/real). The flag comes from the args the config adds, or is one the agent renders for a setting
 * that this engine version predates.
 */
export const commandLineHint = (config: AgentConfig, engine: string): ExitHint => {
  return {
    patterns: [
      ": error: unrecognized arguments: ",
      // "argument --dtype: invalid choice: ...", "argument -tp/--tensor-parallel-size: invalid int value: ..."
      ": error: argument -",
      ": error: the following arguments are required: ",
      "error: invalid argument: ",
      "error while handling argument ",
      // ... and for a LLAMA_ARG_* variable it reads as a flag (common/arg.cpp): "error while handling environment
      // variable \"LLAMA_ARG_CTX_SIZE\": ..."
      "error while handling environment variable "
    ],
    hint:
      `${engine} refused its command line (the line names the flag): remove or fix it in engine.args or ` +
      `${modelKey(config, "args")}; a flag the agent renders for a setting needs a ${engine} version that has it ` +
      "(`cgn-agent render` prints the command line)"
  }
}
