// Stand-ins for the engines' executables, for `cgn-agent check` on a host without the engines installed: check
// refuses an engine command that the engine's spawn would not find (src/programs/hostChecks.ts).
import * as fs from "node:fs"
import * as path from "node:path"

/** The backends' default executables (src/layers/engine/backends/*.ts `executable`). */
const DEFAULT_EXECUTABLES = ["vllm", "python", "llama-server", "mlx_lm.server"] as const

/**
 * Writes a `bin` directory of do-nothing default engine executables under `dir`; returns the environment for
 * runCli with that directory first on PATH.
 */
export const engineBinEnv = (dir: string): Record<string, string> => {
  const bin = path.join(dir, "engine-bin")
  fs.mkdirSync(bin, { recursive: true })
  for (const name of DEFAULT_EXECUTABLES) fs.writeFileSync(path.join(bin, name), "#!/bin/sh\nexit 0\n", { mode: 0o755 })
  return { PATH: `${bin}${path.delimiter}${process.env.PATH ?? ""}` }
}
