/**
 * A small record file that survives a power loss as the operator left it: written to a temp file that is synced
 * before it is renamed over the old one, and the directory synced after the rename or a removal (POSIX makes a
 * rename durable only once its directory is: rename(2), fsync(2)). The cordon's record needs this: an
 * acknowledged cordon lost to a node's crash would put the node back into traffic after its reboot (Kubernetes
 * keeps a pod's emptyDir across a node reboot).
 */
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { type MakeDirsFs, makeDirs } from "./makeDirs.ts"
import { DIR_MODE, type WriteFs, writeAtomically } from "./stateFiles.ts"

/** The file system calls used, so a test can see their order. */
export type DurableFs = WriteFs & MakeDirsFs

/**
 * Syncs `dir`. Its failure comes after the change it was to make durable (a rename, a removal), which has happened
 * and cannot be taken back safely: it is said, not thrown, so that the caller acts on what is on disk.
 */
const syncDir = async (dir: string, fs: DurableFs): Promise<string | undefined> => {
  try {
    const handle = await fs.open(dir, "r")
    try {
      await handle.sync()
    } finally {
      await handle.close()
    }
    return undefined
  } catch (e) {
    return `${dir} could not be synced (${e instanceof Error ? e.message : String(e)}): the change may not outlive a crash`
  }
}

/**
 * Replaces `file` with `data` atomically and durably (creating its directory when missing, mode 0700). Throws when
 * the file was not replaced (its temp file removed); resolves with a warning when it was but its directory could
 * not be synced. The temp file is new (O_EXCL|O_NOFOLLOW, 0600) under a random name (stateFiles.ts writeAtomically): a
 * link planted in the directory is never written through, and the rename replaces a link at `file` itself.
 */
export const writeDurably = async (file: string, data: string, fs: DurableFs = fsp): Promise<string | undefined> => {
  const dir = path.dirname(file)
  await makeDirs(dir, fs, DIR_MODE)
  await writeAtomically(file, data, true, fs)
  return syncDir(dir, fs)
}

/**
 * Removes `file` (none is no error) and syncs its directory, so the removal outlives a crash too. Throws when the
 * file is still there; resolves with a warning when it is gone but its directory could not be synced.
 */
export const removeDurably = async (file: string, fs: DurableFs = fsp): Promise<string | undefined> => {
  try {
    await fs.rm(file)
  } catch (e) {
    // no file, or no directory: nothing was there to remove, and nothing to sync
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined
    throw e
  }
  return syncDir(path.dirname(file), fs)
}
