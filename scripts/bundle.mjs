// Bundles the daemon's entry (dist/main.js, as tsc wrote it) with Effect, minified, in place: dist/main.js
// becomes the bundle's entry and the rest goes to dist/programs/bundle-*.js. Measured reason (docs/bench.md,
// "Bundled entry"): V8 keeps every loaded module's source text in the heap, and Effect's sources are mostly
// documentation comments; an idle agent's heap was 52 MiB, 19 MiB of it source strings. Bundled and minified
// (identifiers kept, so stack traces still name functions): heap 25 MiB, RSS 131 -> 111 MiB.
// Only Effect (effect, @effect/*) and the agent's own modules are bundled: every other package stays a plain
// import from node_modules, as some read their own files at run time (grpc-health-check's and reflection's
// .proto files, koffi's and zeromq's native addons).
// The library entry points (dist/index.js, testing, kvcached) and the other programs (sim, guard, kvcached
// receiver) stay tsc's output. The chunk layout keeps `import.meta.url` meaningful: src/main.ts only checks the
// Node version and imports programs/entry.ts, so every other module lands in dist/programs/, next to guard.js
// (programs/programPaths.ts resolves the guard and the NVML worker from there).
import { readdirSync, rmSync } from "node:fs"
import { build } from "rolldown"

const dist = new URL("../dist/", import.meta.url)
for (const f of readdirSync(new URL("programs/", dist))) {
  if (f.startsWith("bundle-")) rmSync(new URL(`programs/${f}`, dist))
}
await build({
  input: { main: new URL("main.js", dist).pathname },
  platform: "node",
  external: (id) => !id.startsWith(".") && !id.startsWith("/") && !/^(effect|@effect\/)/.test(id),
  logLevel: "warn",
  output: {
    dir: dist.pathname,
    format: "esm",
    minify: { mangle: false, compress: true, codegen: { removeWhitespace: true } },
    entryFileNames: "[name].js",
    chunkFileNames: "programs/bundle-[name].js"
  }
})
