// Marks the built entry points executable, so `npx cgn-agent` and `npx cgn-engine-sim` run them.
import { chmodSync, existsSync } from "node:fs"

for (const bin of ["dist/main.js", "dist/programs/sim.js", "dist/programs/kvcachedReceiver.js"]) {
  if (existsSync(bin)) chmodSync(bin, 0o755)
}
