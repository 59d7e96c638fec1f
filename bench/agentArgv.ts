// The command line of the relay under test, for bench/relay.ts and bench/per-call.ts: the built daemon of a
// checkout (`ROOT/dist/main.js run --config FILE`), or bench/floor.ts (the least a Node relay does) on the same
// ports and engine.
import { readFileSync } from "node:fs"
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

/** The image's command line up to the agent (the Dockerfile's last ENTRYPOINT): the bench runs the agent alike. */
const imageEntrypoint = (): Array<string> => {
  const entry = [...readFileSync(path.join(repoRoot, "Dockerfile"), "utf8").matchAll(/^ENTRYPOINT (\[.*\])$/gm)].at(-1)
  return JSON.parse(entry?.[1] ?? "[]") as Array<string>
}

/** The Node flags the image runs the agent with: the words between `node` and the agent's main.js. */
export const imageNodeFlags = (): Array<string> => {
  const argv = imageEntrypoint()
  return argv.slice(argv.indexOf("node") + 1, argv.indexOf("/opt/cgn-agent/dist/main.js"))
}

/** The variables the image sets for the agent alone: the `NAME=VALUE` words `env` runs `node` with. */
export const imageAgentEnv = (): Record<string, string> => {
  const argv = imageEntrypoint()
  const words = argv.slice(argv.indexOf("/usr/bin/env") + 1, argv.indexOf("node")).filter((w) => w.includes("="))
  return Object.fromEntries(words.map((w) => [w.slice(0, w.indexOf("=")), w.slice(w.indexOf("=") + 1)]))
}
