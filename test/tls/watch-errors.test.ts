// watchChanges (layers/tls/watchChanges.ts) when a watch fails after it was set: node:fs's FSWatcher emits 'error'
// (its inotify handle's error, or EPERM where the watched directory goes), and an 'error' with no listener is thrown
// from the event loop, which ends the daemon. node:fs's watch is wrapped here to reach the watchers it made.
import type * as fs from "node:fs"
import { Effect, Queue } from "effect"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { watchChanges } from "../../src/layers/tls/watchChanges.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"

const made = vi.hoisted(() => [] as Array<fs.FSWatcher>)
vi.mock("node:fs", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs")>()
  const watch = (...args: Parameters<typeof real.watch>) => {
    const w = real.watch(...args)
    made.push(w)
    return w
  }
  return { ...real, watch }
})

let pki: TestPki
beforeAll(() => {
  pki = makeTestPki()
})
afterAll(() => pki?.cleanup())

describe("watchChanges' watches", () => {
  it("a watch's 'error' is taken (that watch closed), not thrown; the others still report", async () => {
    const changes = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const queue = yield* Queue.sliding<void>(1)
          yield* watchChanges([pki.server.certFile, pki.server.keyFile], { sighup: false }, queue)
          // the directory and both files
          expect(made).toHaveLength(3)
          const [dir, cert] = made as [fs.FSWatcher, fs.FSWatcher]
          const closed = vi.spyOn(cert, "close")
          expect(() => cert.emit("error", Object.assign(new Error("watch failed"), { code: "EPERM" }))).not.toThrow()
          expect(closed).toHaveBeenCalledOnce()
          dir.emit("change", "change", "tls.crt")
          return yield* Queue.take(queue).pipe(Effect.as("reported"), Effect.timeoutOption("5 seconds"))
        })
      )
    )
    expect(changes._tag).toBe("Some")
  })
})
