// The kvcached link connects only to a socket it can trust (src/layers/kv/kvcachedClient.ts, through
// layers/stateDir/stateFiles.ts socketDistrust): whoever listens at kv.uds gets the node's KV events (the block
// hashes of prompts' prefixes), so one in a directory others may write could be another local user's. With a
// listener there, such a socket is refused like a failed connect (Hello never reaches it), and retried: once the
// directory is fixed, the link comes up.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { runLink } from "../../src/layers/kv/kvcachedClient.ts"
import { serve } from "../../src/layers/kv/kvcachedReceiver.ts"
import { type QueuedBody, resyncOf } from "../../src/layers/kv/rankSequencer.ts"
import { KvQueue } from "../../src/services/kv/KvQueue.ts"
import { hello } from "../../src/services/kv/KvWire.ts"
import { pollUntil } from "../support/poll.ts"

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

/** A receiver listening at `<temp dir>/kvcached.sock`, counting the Hellos it gets. */
const receiver = async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "kvtrust-"))
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }))
  const sock = path.join(dir, "kvcached.sock")
  const seen = { hellos: 0 }
  const scope = await Effect.runPromise(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const server = serve(sock, {
    Hello: () => Effect.sync(() => void seen.hellos++).pipe(Effect.as({ applied: null })),
    Push: (p) => Effect.succeed({ applied: p.records.at(-1)?.n ?? null })
  })
  await Effect.runPromise(Layer.buildWithScope(server, scope))
  return { dir, sock, seen }
}

/** The link to `sock`, with every failure it reports. */
const link = (sock: string) => {
  const downs: Array<string> = []
  let up = false
  const fiber = Effect.runFork(
    runLink({
      path: sock,
      queue: new KvQueue<QueuedBody>(1 << 20),
      hello: hello(
        { node_id: "n1", cluster: "c", model: "m", engine: "vllm" },
        { epoch: "e", blockSize: 4, dpSize: 1 }
      ),
      resync: resyncOf,
      materialize: (record) => ({ record, dropped: false }),
      backoffMaxMs: 200,
      onConnected: (connected, error, retryInMs) => {
        up = connected
        if (!connected && retryInMs !== undefined) downs.push(error ?? "")
      },
      onForwarded: () => {}
    })
  )
  cleanups.push(() => Effect.runPromise(Fiber.interrupt(fiber)))
  return { downs, up: () => up }
}

describe("the kvcached link refuses a socket it cannot trust", () => {
  it("in a directory anyone may write (0777, not sticky): never connected, retried, and connected once fixed", async () => {
    const r = await receiver()
    await fs.chmod(r.dir, 0o777)
    const l = link(r.sock)
    await pollUntil("two refusals", () => l.downs.length >= 2, 10_000, 10)
    expect(l.downs[0]).toBe(
      `kv.uds ${r.sock} is in an untrusted directory: ${r.dir} is writable by its group and others (mode 0777): not connecting`
    )
    expect(r.seen.hellos).toBe(0)
    // the backoff's next try finds it fixed
    await fs.chmod(r.dir, 0o700)
    await pollUntil("connected", () => l.up(), 10_000, 10)
    expect(r.seen.hellos).toBeGreaterThanOrEqual(1)
  })

  it("through a symbolic link to it: not followed, never connected", async () => {
    const r = await receiver()
    const linkPath = path.join(r.dir, "link.sock")
    await fs.symlink(r.sock, linkPath)
    const l = link(linkPath)
    await pollUntil("two refusals", () => l.downs.length >= 2, 10_000, 10)
    expect(l.downs[0]).toBe(`kv.uds ${linkPath} is a symbolic link (not followed): not connecting`)
    expect(r.seen.hellos).toBe(0)
    expect(l.up()).toBe(false)
  })
})
