#!/usr/bin/env node
/**
 * The `cgn-agent` binary. It first checks the Node version, with nothing else loaded: the dependencies need
 * Node 24 (undici 8, Effect 4) and on an older Node die at import with an error that names neither Node nor
 * the version. The CLI itself is imported only after the check (programs/entry.ts).
 */
import { nodeTooOld } from "./programs/nodeVersion.ts"

// A SIGHUP that comes while the modules load (a reload right after start: systemd's ExecReload) must not end the
// process, as Node's default would (exit 129, no line said): runMain.ts routes it once the daemon is up and ignores
// it until then, but that module is not loaded yet for the first ~0.2 s. This listener holds that gap.
process.on("SIGHUP", () => undefined)

const tooOld = nodeTooOld(process.versions.node, process.execPath)
if (tooOld !== undefined) {
  process.stderr.write(`${tooOld}\n`)
  process.exit(1)
}
await import("./programs/entry.ts")
