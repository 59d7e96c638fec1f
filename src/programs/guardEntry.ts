/**
 * Where the orphan guard program (guard.ts, next to this module) lives in both layouts: src/ (run as .ts) and
 * dist/ (built .js). The daemon hands it to the engine host layer; a layer never computes a program's path.
 * In the bundled dist/main.js (scripts/bundle.mjs) this module sits in a dist/programs/bundle-*.js chunk, so
 * "next to this module" is still dist/programs/, where tsc wrote guard.js.
 */
export const guardEntry = (): string => {
  const ext = import.meta.url.endsWith(".ts") ? "ts" : "js"
  return new URL(`./guard.${ext}`, import.meta.url).pathname
}
