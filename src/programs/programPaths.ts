/**
 * Where the programs the daemon starts live, in both layouts: src/ (run as .ts) and dist/ (built .js). The daemon
 * hands each path to the layer that starts it; a layer never computes a program's path. In the bundled
 * dist/main.js (scripts/bundle.mjs) this module sits in a dist/programs/bundle-*.js chunk, so "next to this
 * module" is still dist/programs/, where tsc wrote the programs.
 */
const programPath = (name: string): string => {
  const ext = import.meta.url.endsWith(".ts") ? "ts" : "js"
  return new URL(`./${name}.${ext}`, import.meta.url).pathname
}

/** The orphan guard (guard.ts), through which the engine host spawns every engine run. */
export const guardEntry = (): string => programPath("guard")

/** The NVML worker thread (nvmlWorker.ts), started by the Nvml layer. */
export const nvmlWorkerEntry = (): string => programPath("nvmlWorker")
