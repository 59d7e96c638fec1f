// The command line of the relay under test, for bench/relay.ts and bench/per-call.ts: the built daemon of a
// checkout (`ROOT/dist/main.js run --config FILE`), or bench/floor.ts (the least a Node relay does) on the same
// ports and engine.
import * as path from "node:path"
import { repoRoot } from "../test/support/agent.ts"

export interface RelayUnderTest {
  /** A checkout whose dist/main.js runs, or "floor". */
  readonly root: string
  readonly config: string
  readonly grpcPort: number
  readonly adminPort: number
  readonly engineUrl: string
}

/** Node's arguments (after its own flags) for the relay under test. */
export const relayArgv = (r: RelayUnderTest): Array<string> =>
  r.root === "floor"
    ? [
        path.join(repoRoot, "bench/floor.ts"),
        ...["--grpc", String(r.grpcPort), "--admin", String(r.adminPort), "--engine", r.engineUrl]
      ]
    : [path.join(r.root, "dist/main.js"), "run", "--config", r.config]
