/**
 * What triggers a certificate reload: a change of a watched file or its directory (fs.watch) and SIGHUP.
 * Both are registered as one scoped resource and removed with the scope.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Queue } from "effect"

/**
 * Offers to `queue` on a change of a watched file or directory (file watches re-armed on each event: a replaced
 * file is a new inode) and on SIGHUP. Registered before this effect returns; removed with the scope. Returns the
 * directories that could not be watched, with why (inotify's watch limit reached, ENOSPC, is common on busy
 * nodes): the caller's periodic re-read is then all that sees a change.
 */
export const watchChanges = (
  files: ReadonlyArray<string>,
  options: { readonly watch?: boolean; readonly sighup?: boolean },
  queue: Queue.Queue<void>
) =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => {
        const watchers = new Map<string, fs.FSWatcher>()
        const arm = (target: string): string | undefined => {
          watchers.get(target)?.close()
          try {
            const w = fs.watch(target, { persistent: false }, () => onEvent())
            w.on("error", () => w.close())
            watchers.set(target, w)
            return undefined
          } catch (e) {
            watchers.delete(target) // a file mid-swap; the directory watch still reports it
            return e instanceof Error ? e.message : String(e)
          }
        }
        const onEvent = () => {
          for (const f of files) arm(f)
          Queue.offerUnsafe(queue, undefined)
        }
        const unwatched: Array<{ readonly path: string; readonly reason: string }> = []
        if (options.watch !== false) {
          for (const dir of new Set(files.map((f) => path.dirname(f)))) {
            const reason = arm(dir)
            if (reason !== undefined) unwatched.push({ path: dir, reason })
          }
          for (const f of files) arm(f)
        }
        const onHup = () => Queue.offerUnsafe(queue, undefined)
        if (options.sighup !== false) process.on("SIGHUP", onHup)
        return { watchers, onHup, unwatched }
      }),
      ({ watchers, onHup }) =>
        Effect.sync(() => {
          process.off("SIGHUP", onHup)
          for (const w of watchers.values()) w.close()
        })
    ),
    ({ unwatched }) => unwatched
  )
