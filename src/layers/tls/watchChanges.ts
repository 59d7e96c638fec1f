/**
 * What triggers a certificate reload: a change of a watched file or its directory (fs.watch) and SIGHUP.
 * Both are registered as one scoped resource and removed with the scope.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Queue } from "effect"

/**
 * Offers to `queue` on a change of a watched file or directory (file watches re-armed on each event: a replaced
 * file is a new inode) and on SIGHUP. Registered before this effect returns; removed with the scope.
 */
export const watchChanges = (
  files: ReadonlyArray<string>,
  options: { readonly watch?: boolean; readonly sighup?: boolean },
  queue: Queue.Queue<void>
) =>
  Effect.asVoid(
    Effect.acquireRelease(
      Effect.sync(() => {
        const watchers = new Map<string, fs.FSWatcher>()
        const arm = (target: string) => {
          watchers.get(target)?.close()
          try {
            const w = fs.watch(target, { persistent: false }, () => onEvent())
            w.on("error", () => w.close())
            watchers.set(target, w)
          } catch {
            watchers.delete(target) // a file mid-swap; the directory watch still reports it
          }
        }
        const onEvent = () => {
          for (const f of files) arm(f)
          Queue.offerUnsafe(queue, undefined)
        }
        if (options.watch !== false) for (const t of [...new Set(files.map((f) => path.dirname(f))), ...files]) arm(t)
        const onHup = () => Queue.offerUnsafe(queue, undefined)
        if (options.sighup !== false) process.on("SIGHUP", onHup)
        return { watchers, onHup }
      }),
      ({ watchers, onHup }) =>
        Effect.sync(() => {
          process.off("SIGHUP", onHup)
          for (const w of watchers.values()) w.close()
        })
    )
  )
