/**
 * A small record file that survives a power loss as the operator left it: written to a temp file that is synced
 * before it is renamed over the old one, and the directory synced after the rename or a removal (POSIX makes a
 * rename durable only once its directory is: rename(2), fsync(2)). The cordon's record needs this: an
 * acknowledged cordon lost to a node's crash would put the node back into traffic after its reboot (Kubernetes
 * keeps a pod's emptyDir across a node reboot).
 */
import * as fsp from "node:fs/promises"
import * as path from "node:path"

/** The file system calls used, so a test can see their order. */
export type DurableFs = Pick<typeof fsp, "open" | "rename" | "rm" | "mkdir">

const syncDir = async (dir: string, fs: DurableFs) => {
  const handle = await fs.open(dir, "r")
  try {
    await handle.sync()
  } finally {
    await handle.close()
  }
}

/** Replaces `file` with `data` atomically and durably (creating its directory when missing). */
export const writeDurably = async (file: string, data: string, fs: DurableFs = fsp): Promise<void> => {
  const dir = path.dirname(file)
  await fs.mkdir(dir, { recursive: true })
  const tmp = `${file}.${process.pid}.tmp`
  const handle = await fs.open(tmp, "w")
  try {
    await handle.writeFile(data)
    await handle.sync()
  } finally {
    await handle.close()
  }
  await fs.rename(tmp, file)
  await syncDir(dir, fs)
}

/** Removes `file` (none is no error) and syncs its directory, so the removal outlives a crash too. */
export const removeDurably = async (file: string, fs: DurableFs = fsp): Promise<void> => {
  await fs.rm(file, { force: true })
  await syncDir(path.dirname(file), fs).catch((e: NodeJS.ErrnoException) => {
    // no directory: nothing was there to remove
    if (e.code !== "ENOENT") throw e
  })
}
