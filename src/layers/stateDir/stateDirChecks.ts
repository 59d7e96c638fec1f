/**
 * `check`'s (and `run`'s, before it starts) look at agent.state_dir, reading only (but for the probe file of an
 * existing state_dir): the directory itself, else its first existing ancestor, must be a writable directory, not on a
 * kernel filesystem (procfs, sysfs: mkdir there fails, and as root every permission check passes); one that exists
 * must also take a small file, written and removed (a full filesystem). programs/hostChecks.ts says what they find.
 */
import { randomUUID } from "node:crypto"
import { constants } from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { codeOf } from "./makeDirs.ts"
import { writeNew } from "./stateFiles.ts"

/** Kernel filesystems nothing can be created in (statfs f_type, linux/magic.h). */
const KERNEL_FS: ReadonlyMap<number, string> = new Map([
  [0x9fa0, "procfs"],
  [0x62656572, "sysfs"]
])

/** The remedy every line about a state_dir the agent cannot use ends with. */
export const STATE_DIR_ADVICE = "set agent.state_dir to a writable local directory"

/**
 * The problem line for a state_dir that cannot be used (`check`, `run` before it starts, and the start's own
 * refusal: ensureStateDir.ts).
 */
export const stateDirLine = (stateDir: string, problem: string): string =>
  `agent.state_dir = "${stateDir}": ${problem}; ${STATE_DIR_ADVICE}`

/**
 * Why `stateDir` could not be used (created, locked, written) by `run`, or undefined. Reads only: the directory if
 * it exists, else the first ancestor that does, which must be a writable directory off procfs and sysfs.
 */
export const stateDirProblem = async (stateDir: string, cwd: string): Promise<string | undefined> => {
  const target = path.resolve(cwd, stateDir)
  let dir = target
  for (;;) {
    try {
      const st = await fsp.stat(dir)
      if (!st.isDirectory())
        return dir === target ? `${dir} is not a directory` : `${dir} is not a directory, so ${target} cannot be made`
      break
    } catch (e) {
      const code = codeOf(e)
      const parent = path.dirname(dir)
      if ((code !== "ENOENT" && code !== "ENOTDIR") || parent === dir) return `${dir}: ${code}`
      // stat follows links: a dangling one is "not found", yet nothing can be made in its place (makeDirs.ts)
      if (
        code === "ENOENT" &&
        (await fsp.lstat(dir).then(
          (l) => l.isSymbolicLink(),
          () => false
        ))
      )
        return dir === target
          ? `${dir} is a symbolic link to a missing target`
          : `${dir} is a symbolic link to a missing target, so ${target} cannot be made`
      dir = parent
    }
  }
  const real = await fsp.realpath(dir).catch(() => dir)
  const kind = await fsp.statfs(real).then(
    (s) => KERNEL_FS.get(Number(s.type)),
    () => undefined
  )
  const under = ["/proc", "/sys"].find((k) => real === k || real.startsWith(`${k}/`))
  if (kind !== undefined || under !== undefined)
    return `${real} is on ${kind ?? under} (a kernel filesystem): nothing can be kept there`
  try {
    await fsp.access(dir, constants.W_OK | constants.X_OK)
  } catch (e) {
    return dir === target
      ? `${dir} is not writable (${codeOf(e)})`
      : `${target} cannot be made in ${dir} (${codeOf(e)})`
  }
  return undefined
}

/**
 * Why an existing `stateDir` cannot be written, or undefined: a small file is written in it and removed, as `run`'s
 * lock file is (a full filesystem passes every permission check, and a read-only mount as root too). A state_dir that
 * does not exist yet is left alone: check creates nothing (stateDirProblem judged its ancestor).
 */
export const stateDirWriteProblem = async (stateDir: string, cwd: string): Promise<string | undefined> => {
  const target = path.resolve(cwd, stateDir)
  const isDir = await fsp.stat(target).then(
    (st) => st.isDirectory(),
    () => false
  )
  if (!isDir) return undefined
  const probe = path.join(target, `.cgn-agent-check.${randomUUID()}`)
  // new, mode 0600, never through a link (stateFiles.ts); about the size of the lock record run writes
  const failed = await writeNew(probe, `${"x".repeat(255)}\n`).then(
    () => undefined,
    (e: unknown) => e
  )
  await fsp.rm(probe, { force: true }).catch(() => undefined)
  if (failed === undefined) return undefined
  return `${target} cannot be written (${failed instanceof Error ? failed.message : String(failed)}); run could not write its lock there`
}
