// Trims a production node_modules (after `npm ci --omit=dev --omit=peer`) of what the agent never loads,
// for the container image: `node scripts/prune-prod.mjs [DIR]` (default ./node_modules). Each entry says why it
// is safe; nothing here is imported at run time (test/programs/packaging.test.ts starts the agent on the result).
import { existsSync, readdirSync, rmSync } from "node:fs"
import * as path from "node:path"

const root = path.resolve(process.argv[2] ?? "node_modules")
const removed = []
const rm = (rel, why) => {
  const p = path.join(root, rel)
  if (!existsSync(p)) return
  rmSync(p, { recursive: true, force: true })
  removed.push(`${rel} (${why})`)
}

// TypeScript sources shipped next to the compiled output (package "exports" point at dist/).
rm("effect/src", "TypeScript sources; exports point at dist/")
rm("@effect/platform-node/src", "TypeScript sources")
rm("@effect/platform-node-shared/src", "TypeScript sources")
rm("@effect/opentelemetry/src", "TypeScript sources")
// zeromq's prebuilt addons for other operating systems (its loader picks build/<platform>/<arch>).
const zmq = path.join(root, "zeromq", "build")
if (existsSync(zmq))
  for (const os of readdirSync(zmq))
    if (os !== process.platform && os !== "manifest.json") rm(`zeromq/build/${os}`, `not ${process.platform}`)
// zeromq's C++ sources and build scripts: the addon is prebuilt.
rm("zeromq/src", "addon sources (prebuilt)")
rm("zeromq/script", "build scripts (prebuilt)")
// Type declarations only (@types/ws, a dependency of @effect/platform-node-shared, depends on @types/node).
rm("@types", "type declarations only")

for (const r of removed) console.log(`removed ${r}`)
