// --sim-strict-args: the simulator stands for an engine version that knows only the flags it models, and refuses any
// other on its command line as the engine's parser does, before loading anything. Pure: the lines and the exit are
// data (startFailures.ts's StartDeath); src/programs/sim.ts writes them.
// - vLLM, SGLang and mlx-lm parse with Python's argparse (vllm/utils FlexibleArgumentParser, sglang/launch_server.py,
//   mlx_lm/server.py): `ArgumentParser.error` prints the usage line, then "PROG: error: unrecognized arguments: ...",
//   on stderr, and exits 2 (cpython Lib/argparse.py, parse_args and error).
// - llama-server (common/arg.cpp, common_params_parse): "error: invalid argument: FLAG" on stderr, exit 1 (measured
//   against the real server of test/real).
import type { Flavor } from "./simConfig.ts"
import type { StartDeath } from "./startFailures.ts"

/** argparse's `prog` and the start of its usage line, per flavor. */
const ARGPARSE: Record<Exclude<Flavor, "llama_cpp">, { readonly prog: string; readonly usage: string }> = {
  vllm: { prog: "vllm serve", usage: "usage: vllm serve [model_tag] [options]" },
  sglang: { prog: "launch_server.py", usage: "usage: launch_server.py [-h] --model-path MODEL_PATH [options]" },
  mlx: { prog: "mlx_lm.server", usage: "usage: mlx_lm.server [-h] [--model MODEL] [options]" }
}

/** How the flavor's engine refuses `flags` (not empty) on its command line. */
export const unknownFlagsRefusal = (flavor: Flavor, flags: ReadonlyArray<string>): StartDeath => {
  if (flavor === "llama_cpp")
    return { lines: [{ stream: "stderr", text: `error: invalid argument: ${flags[0] ?? ""}` }], exit: { code: 1 } }
  const { prog, usage } = ARGPARSE[flavor]
  return {
    lines: [
      { stream: "stderr", text: usage },
      { stream: "stderr", text: `${prog}: error: unrecognized arguments: ${flags.join(" ")}` }
    ],
    exit: { code: 2 }
  }
}
