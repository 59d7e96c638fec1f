// The reference kvcached receiver, for tests that run it as its own process.
import * as path from "node:path"
import { fileURLToPath } from "node:url"

/** The receiver program's source entry (Node 24 runs the .ts as is). */
export const receiverEntry = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "../../src/programs/kvcachedReceiver.ts"
)
