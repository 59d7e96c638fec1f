/**
 * How the agent touches agent.state_dir: the one place that creates and reads its files, and the check that the
 * directory is the agent's own (the same rule guards the directory of kv.uds: socketDistrust). The agent often runs as root and trusts what it finds there (the engine pid file
 * names a process group it kills), so, as sshd's StrictModes does for ~/.ssh (openssh-portable auth.c,
 * auth_secure_path): the directory must be owned by the agent's user or root and writable by its owner only, and
 * so must every directory above it unless sticky (/tmp: nobody may rename another's entry there). Within it:
 * - a new file (a temp file before its rename, a lock) is created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, under
 *   a name with 64 random bits: a link planted under a predictable name can no longer redirect a root write;
 * - a file is read with O_NOFOLLOW, and only a regular file: a symbolic link is refused (never followed), so no
 *   byte of another file reaches a log line.
 */
import { randomBytes } from "node:crypto"
import { constants, type Stats } from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { Duration, Effect } from "effect"

/** The mode of every file the agent creates in state_dir (and of state_dir when the agent creates it). */
export const FILE_MODE = 0o600
export const DIR_MODE = 0o700

/** open(2) flags of a new file: never an existing one, never through a symbolic link. */
export const CREATE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW

/**
 * A temp name beside `file`: this process's pid (a sweep of leftovers skips its own: sweepTemps) and 64
 * random bits, so nobody can plant anything under it beforehand.
 */
export const tempNameFor = (file: string): string => `${file}.${process.pid}.${randomBytes(8).toString("hex")}.tmp`

/** The file system calls a write uses, so a test can see their order (durableFile.ts). */
export type WriteFs = Pick<typeof fsp, "open" | "rename" | "rm">

/** Creates `file` (which must not exist, nor be a link) with `data`, mode 0600; `sync`: synced before it is closed. */
export const writeNew = async (
  file: string,
  data: string,
  sync = false,
  fs: Pick<WriteFs, "open"> = fsp
): Promise<void> => {
  const handle = await fs.open(file, CREATE_FLAGS, FILE_MODE)
  try {
    await handle.writeFile(data)
    if (sync) await handle.sync()
  } finally {
    await handle.close()
  }
}

/**
 * Replaces `file` with `data` atomically: a new temp file beside it (writeNew under tempNameFor's name, so a link
 * planted in the directory is never written through), then renamed over it (the rename replaces a link at `file`
 * itself). Throws when the file was not replaced, its temp file removed. `sync`: the temp file is synced before the
 * rename (durableFile.ts; the engine pid file does without: it names a process group, which a crash of the node
 * ends).
 */
export const writeAtomically = async (file: string, data: string, sync: boolean, fs: WriteFs = fsp): Promise<void> => {
  // one temp file per write: a write whose waiter gave up (a timeout) may still be running under a later one
  const tmp = tempNameFor(file)
  try {
    await writeNew(tmp, data, sync, fs)
    await fs.rename(tmp, file)
  } catch (e) {
    await fs.rm(tmp, { force: true }).catch(() => undefined)
    throw e
  }
}

const withCode = (message: string, code: string): NodeJS.ErrnoException => Object.assign(new Error(message), { code })

/**
 * The text of the regular file `file`, never through a symbolic link: a link fails with code ELOOP and a message
 * that says so; anything else but a regular file (a FIFO: O_NONBLOCK keeps its open from hanging) with EINVAL; a
 * file above `maxBytes` with EFBIG. A missing file fails with ENOENT as readFile does.
 */
export const readNoFollow = async (file: string, maxBytes?: number): Promise<string> => {
  let handle: fsp.FileHandle
  try {
    handle = await fsp.open(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ELOOP")
      throw withCode(`${file} is a symbolic link: not followed (the agent reads only its own files there)`, "ELOOP")
    throw e
  }
  try {
    const st = await handle.stat()
    if (!st.isFile()) throw withCode(`${file} is not a regular file: not read`, "EINVAL")
    if (maxBytes !== undefined && st.size > maxBytes)
      throw withCode(`${file} has ${st.size} bytes, more than the agent ever writes there`, "EFBIG")
    return await handle.readFile("utf8")
  } finally {
    await handle.close()
  }
}

const octal = (mode: number): string => `0${(mode & 0o7777).toString(8)}`

/** Who besides the owner may write, by the mode's group (0o020) and other (0o002) write bits. */
const writers = (mode: number): string =>
  (mode & 0o020) === 0 ? "others" : (mode & 0o002) === 0 ? "its group" : "its group and others"

/** Why a directory with these stats is not trusted (`self`: state_dir itself, else a directory above it). */
const distrustOf = (dir: string, st: Stats, uid: number, self: boolean): string | undefined => {
  if (st.uid !== uid && st.uid !== 0)
    return `${dir} is owned by uid ${st.uid}, not by the agent's user (uid ${uid}) or root`
  const sticky = (st.mode & 0o1000) !== 0 // S_ISVTX, the sticky bit (inode(7))
  if ((st.mode & 0o022) !== 0 && (self || !sticky))
    return `${dir} is writable by ${writers(st.mode)} (mode ${octal(st.mode)})`
  return undefined
}

/**
 * Why `stateDir` is not to be trusted, or undefined: it (or, while it does not exist yet, the directory it would
 * be made in) must be owned by `uid` or root and writable by its owner only; every directory above it too, unless
 * sticky. Links are resolved first (the real directory is what is written). Unknown (no uid: not POSIX, or a
 * path that cannot be read: stateDirProblem says why) is no finding.
 */
export const stateDirDistrust = async (
  stateDir: string,
  uid: number | undefined = process.getuid?.()
): Promise<string | undefined> => {
  if (uid === undefined) return undefined
  const link = await linkDistrust(stateDir, uid)
  if (link !== undefined) return link
  let dir = path.resolve(stateDir)
  // the deepest part that exists: the agent creates the rest, mode 0700
  for (;;) {
    const real = await fsp.realpath(dir).catch(() => undefined)
    if (real !== undefined) {
      dir = real
      break
    }
    const parent = path.dirname(dir)
    if (parent === dir) return undefined
    dir = parent
  }
  const exists = dir === (await fsp.realpath(path.resolve(stateDir)).catch(() => undefined))
  return chainDistrust(dir, uid, exists)
}

/** The most symbolic links one path may pass through, as Linux (path_resolution(7): ELOOP past 40). */
const MAX_LINKS = 40

/**
 * Why a symbolic link on the way to `target` (as configured, walked component by component as the kernel resolves
 * it, through each link's own target) is not trusted, or undefined: each must be owned by `uid` or root, in a
 * directory that passes the rule for the directories above state_dir, as every directory above that one. The real
 * directory's chain is checked apart; this is who can repoint the way there. Through another user's link in /tmp
 * (one they made first where a state_dir was still to be made), the agent wrote root's cordon record and engine pid
 * file into a directory that user owned once they repointed it (security re-check 26). Parts that do not exist yet,
 * cannot be examined or loop are no finding (making or opening them fails apart).
 */
const linkDistrust = async (target: string, uid: number): Promise<string | undefined> => {
  // `..` in the configured path taken as path.join takes it (lexically), as every file the agent opens there is
  // named; `..` in a link's target as the kernel takes it (from the real directory reached).
  const todo = path
    .resolve(target)
    .split("/")
    .filter((p) => p.length > 0)
  let at = "/"
  for (let links = 0; todo.length > 0; ) {
    const part = todo.shift() ?? ""
    if (part === "." || part === "..") {
      if (part === "..") at = path.dirname(at) // `at` holds no link: its parent is the real one
      continue
    }
    const next = path.join(at, part)
    const st = await fsp.lstat(next).catch(() => undefined)
    if (st === undefined) return undefined
    if (!st.isSymbolicLink()) {
      at = next
      continue
    }
    if (++links > MAX_LINKS) return undefined
    if (st.uid !== uid && st.uid !== 0)
      return `${next} is a symbolic link owned by uid ${st.uid}, not by the agent's user (uid ${uid}) or root`
    const why = await chainDistrust(at, uid, false)
    if (why !== undefined) return `${next} is a symbolic link others could replace: ${why}`
    const dest = await fsp.readlink(next).catch(() => undefined)
    if (dest === undefined) return undefined
    todo.unshift(...dest.split("/").filter((p) => p.length > 0))
    if (dest.startsWith("/")) at = "/"
  }
  return undefined
}

/**
 * Why the existing real directory `dir`, or one above it, is not trusted (the rule above); `strict`: `dir` itself
 * may not be writable by group or others even if sticky.
 */
const chainDistrust = async (dir: string, uid: number, strict: boolean): Promise<string | undefined> => {
  for (let at = dir, self = strict; ; self = false) {
    const st = await fsp.stat(at).catch(() => undefined)
    if (st === undefined) return undefined
    const why = distrustOf(at, st, uid, self)
    if (why !== undefined) return why
    const parent = path.dirname(at)
    if (parent === at) return undefined
    at = parent
  }
}

/**
 * Why the directory of a Unix socket the agent connects to (kv.uds) is not trusted, or undefined (also while it does
 * not exist, or with no uid): stateDirDistrust's rule for the directories above state_dir, applied to it and every
 * directory above it. Sticky is fine for the directory itself too (/tmp): nobody can replace another's entry there,
 * and socketDistrust checks the socket's own owner.
 */
export const socketDirDistrust = async (
  dir: string,
  uid: number | undefined = process.getuid?.()
): Promise<string | undefined> => {
  if (uid === undefined) return undefined
  const link = await linkDistrust(dir, uid)
  if (link !== undefined) return link
  const real = await fsp.realpath(path.resolve(dir)).catch(() => undefined)
  return real === undefined ? undefined : chainDistrust(real, uid, false)
}

/**
 * Why the agent is not to connect to the Unix socket `sock`, or undefined (no uid: not POSIX): whoever listens there
 * gets what the agent sends (kv.uds: the block hashes of prompts' prefixes), and in a directory others can write,
 * another local user could bind it first. So, not following a link (lstat), it must be a socket owned by `uid` or
 * root, in a directory that passes socketDirDistrust. A missing socket is refused too (its code in the reason):
 * connecting once it is gone would take whatever another user binds there meanwhile.
 */
export const socketDistrust = async (
  sock: string,
  uid: number | undefined = process.getuid?.()
): Promise<string | undefined> => {
  if (uid === undefined) return undefined
  let st: Stats
  try {
    st = await fsp.lstat(sock)
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? String(e)
    return code === "ENOENT" ? `${sock} does not exist (ENOENT)` : `${sock} cannot be examined (${code})`
  }
  if (st.isSymbolicLink()) return `${sock} is a symbolic link (not followed)`
  if (!st.isSocket()) return `${sock} is not a socket`
  if (st.uid !== uid && st.uid !== 0) return `${sock} is owned by uid ${st.uid}, not the agent's user or root`
  const dir = await socketDirDistrust(path.dirname(sock), uid)
  return dir === undefined ? undefined : `${sock} is in an untrusted directory: ${dir}`
}

/**
 * Removes the temp files writes of earlier processes left next to `file` (killed mid-write, or a write whose wait
 * timed out at the end): tempNameFor names them `<file>.<pid>.<random hex>.tmp` (writeAtomically's). Never fails; a
 * hung directory is left.
 */
export const sweepTemps = (file: string): Effect.Effect<void> => {
  const dir = path.dirname(file)
  const prefix = `${path.basename(file)}.`
  return Effect.promise(async () => {
    const names = await fsp.readdir(dir).catch(() => [] as Array<string>)
    for (const name of names) {
      const pid = /^(\d+)\.[0-9a-f]+\.tmp$/.exec(name.slice(prefix.length))?.[1]
      if (name.startsWith(prefix) && pid !== undefined && Number(pid) !== process.pid) {
        await fsp.rm(path.join(dir, name), { force: true }).catch(() => undefined)
      }
    }
  }).pipe(Effect.timeoutOption(Duration.seconds(5)), Effect.asVoid)
}
