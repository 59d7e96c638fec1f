/**
 * A Unix socket server whose path is removed when it stops only if the path is still its own socket.
 *
 * Why: libuv removes a listening pipe's path by name when the handle closes (github.com/libuv/libuv,
 * src/unix/pipe.c, `uv__pipe_close`: `unlink(handle->pipe_fname)`), and Node's net.Server offers no option against
 * it (ListenOptions: backlog, exclusive, path, readableAll, writableAll, ...). A receiver whose path was deleted and
 * taken by a newer receiver thus deleted the newer one's socket when it stopped: every agent then failed to
 * connect (ENOENT) until the newer receiver restarted.
 *
 * So the server listens on a private name in the same directory, and `path` is made a hard link to that socket
 * (link(2) fails with EEXIST where `path` exists: a receiver that got there meanwhile keeps it, as a bind there would
 * have failed with EADDRINUSE), then the private name is removed. What libuv removes at close is that private name,
 * already gone. This module removes `path` itself, before the server closes, and only if it is still the socket it
 * linked there (same device and inode, recorded at listen time). A newer receiver can take the path only between
 * that check and the removal (microseconds, where before it was the whole life of the older receiver).
 */
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import type * as net from "node:net"
import * as nodePath from "node:path"
import * as NodeSocketServer from "@effect/platform-node/NodeSocketServer"
import { Effect, type Scope } from "effect"
import { NetAddress } from "effect/net"
import { SocketServer } from "effect/socket"

/**
 * Where the server listens before `path` links to it: beside it (a link cannot cross file systems), and short (a Unix
 * socket's path has at most 107 bytes): a dot and 8 random hex digits, no longer than `path` unless its own name is
 * shorter than 9 characters.
 */
const privateName = (path: string) => nodePath.join(nodePath.dirname(path), `.${crypto.randomBytes(4).toString("hex")}`)

const openError = (cause: unknown) =>
  new SocketServer.SocketServerError({ reason: new SocketServer.SocketServerOpenError({ cause }) })

/** The device and inode of what `path` names now (not following a symlink); undefined when nothing is there. */
const identity = (path: string): { readonly dev: number; readonly ino: number } | undefined => {
  try {
    const s = fs.lstatSync(path)
    return { dev: s.dev, ino: s.ino }
  } catch {
    return undefined
  }
}

/**
 * NodeSocketServer.make listening on the Unix socket `path`, with `options` for its net.Server; `path` is removed
 * when the scope closes only while it still names this server's socket (see the module comment). Its `address` is
 * `path`.
 */
export const make = (
  path: string,
  options: net.ServerOpts = {}
): Effect.Effect<SocketServer.SocketServer["Service"], SocketServer.SocketServerError, Scope.Scope> =>
  Effect.gen(function* () {
    const listening = privateName(path)
    const server = yield* NodeSocketServer.make({ ...options, path: listening })
    const own = yield* Effect.try({
      try: () => {
        try {
          fs.linkSync(listening, path)
          return identity(path)
        } finally {
          fs.rmSync(listening, { force: true })
        }
      },
      catch: openError
    })
    // Added after the server's own finalizer, so it runs first: the path goes while the socket still listens, the
    // order libuv keeps for the same reason (a newer receiver binding it in between).
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        const now = identity(path)
        if (own === undefined || now === undefined) return Effect.void
        if (now.dev !== own.dev || now.ino !== own.ino)
          return Effect.logInfo("kvcached receiver: leaving the socket path to the receiver that now owns it", {
            path
          })
        return Effect.sync(() => fs.rmSync(path, { force: true }))
      })
    )
    return SocketServer.SocketServer.of({ address: NetAddress.unixPathAddress(path), run: server.run })
  })
