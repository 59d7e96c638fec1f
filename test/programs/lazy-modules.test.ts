// What a configured mode loads (issue #14: nothing loaded that the configured mode does not use). A
// standalone agent without tracing or [kv] must not load etcd3 (and its grpc-js client), the OpenTelemetry SDK
// or zeromq; each is imported when its feature is configured (layers/registry/etcdClient.ts,
// layers/observability/Tracing.ts, layers/kv/rankSubscriber.ts). Measured with them loaded at start: idle heap
// 59.7 MiB and RSS 141 MiB; without: 52.1 and 131 (docs/bench.md). Nor Node's bundled undici (behind fetch):
// the engine probe uses the undici package and the admin server takes node:http through getBuiltinModule.
// The built agent runs with a module-load hook (test/fixtures/loadLog.mjs). Requires dist/.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllAgents, repoRoot, requireDist, simAgentConfig, startAgent } from "../support/agent.ts"

beforeAll(() => requireDist())
afterAll(() => killAllAgents())

const unused = [
  "/node_modules/etcd3/",
  "/node_modules/@opentelemetry/",
  "/node_modules/@effect/opentelemetry/",
  "/node_modules/zeromq/"
]

describe("modules a standalone agent loads", () => {
  it("no etcd3, OpenTelemetry SDK, zeromq or Node's bundled undici without etcd, tracing or [kv]; the hook sees what it loads", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-load-"))
    const log = path.join(dir, "loaded.txt")
    try {
      const { config } = await simAgentConfig()
      const agent = await startAgent({
        config,
        readyTimeoutMs: 45_000,
        env: {
          NODE_OPTIONS: `--import ${path.join(repoRoot, "test/fixtures/loadLog.mjs")}`,
          CGN_LOAD_LOG: log
        }
      })
      expect((await agent.stop()).code).toBe(0)
      const own = fs
        .readFileSync(log, "utf8")
        .split("\n")
        .filter((l) => l.startsWith(`${agent.pid} `))
        .map((l) => l.slice(l.indexOf(" ") + 1))
      // The hook works: the agent's own modules and the packages it does use are in the log.
      expect(own.some((u) => u.includes("/node_modules/undici/"))).toBe(true)
      expect(own.some((u) => u.includes("/node_modules/prom-client/"))).toBe(true)
      expect(own.filter((u) => unused.some((p) => u.includes(p)))).toEqual([])
      // Node's own modules, listed at exit: its bundled undici (behind fetch, and behind node:http's WebSocket
      // getters that an ESM `import ... from "node:http"` reads) is ~14 MB of RSS the agent does not use.
      expect(own.some((u) => u === "node:internal/http2/core")).toBe(true)
      expect(own.filter((u) => u.includes("internal/deps/undici"))).toEqual([])
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  }, 90_000)
})
