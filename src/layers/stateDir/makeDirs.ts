/**
 * `mkdir -p` that always ends. Node's `fs.mkdir(dir, { recursive: true })` never settles where a parent exists but
 * cannot hold the child: procfs answers ENOENT for a directory it cannot create, as a dangling symbolic link does,
 * and Node takes ENOENT for "make the parent first" and loops for ever, spinning one libuv pool thread (a 10 s
 * bound on the start said so, but the thread spun on; https://github.com/nodejs/node/issues/27198 is the same loop
 * on Windows). Here each level is made once, and an ENOENT once its parent exists is the answer.
 */
import * as fsp from "node:fs/promises"
import * as path from "node:path"

/** The calls used, so a test can fail one. */
export type MakeDirsFs = Pick<typeof fsp, "mkdir" | "stat" | "lstat">

/** An error's errno code (ENOENT...), else the error as text: what a problem line names. */
export const codeOf = (e: unknown): string => (e as NodeJS.ErrnoException).code ?? String(e)

/** `dir` exists: fine when it is a directory (or a link to one), else the reason it cannot be used. */
const existing = async (dir: string, fs: MakeDirsFs): Promise<void> => {
  try {
    if ((await fs.stat(dir)).isDirectory()) return
  } catch (e) {
    if (codeOf(e) === "ENOENT" && (await fs.lstat(dir)).isSymbolicLink())
      throw new Error(`${dir} is a symbolic link to a missing target`)
    throw e
  }
  throw new Error(`${dir} exists and is not a directory`)
}

/**
 * Creates `dir` and its missing parents (mode as mkdir's default; `mode`, when given, for `dir` itself, as
 * `mkdir -p -m`); a directory already there is no error.
 */
export const makeDirs = async (dir: string, fs: MakeDirsFs = fsp, mode?: number): Promise<void> => {
  const once = async (): Promise<void> => {
    try {
      await (mode === undefined ? fs.mkdir(dir) : fs.mkdir(dir, { mode }))
    } catch (e) {
      if (codeOf(e) === "EEXIST") return existing(dir, fs)
      throw e
    }
  }
  try {
    await once()
  } catch (e) {
    const parent = path.dirname(dir)
    if (codeOf(e) !== "ENOENT" || parent === dir) throw e
    await makeDirs(parent, fs)
    // the parent is there now: a second ENOENT is final (where Node's recursive mkdir retries for ever)
    await once()
  }
}
