// The cgn-agent binary run from source as a subprocess, the way a user runs it: exit code and output.
// Shared by the CLI, gRPC and mTLS tests.
import { execFile } from "node:child_process"
import * as path from "node:path"

const ROOT = path.join(import.meta.dirname, "..", "..")
const MAIN = path.join(ROOT, "src", "main.ts")

export interface CliRun {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/**
 * Runs `cgn-agent ARGS`; CGN_AGENT_CONFIG is cleared unless `env` sets it, so the caller's shell cannot leak in.
 * `launcher`: a command that execs the command line after it (e.g. into a cgroup: support/memoryCgroup.ts `enter`).
 */
export const runCli = (
  args: ReadonlyArray<string>,
  env: Record<string, string> = {},
  launcher: ReadonlyArray<string> = []
): Promise<CliRun> =>
  new Promise((resolve) => {
    const childEnv: Record<string, string | undefined> = { ...process.env, ...env }
    if (!("CGN_AGENT_CONFIG" in env)) delete childEnv.CGN_AGENT_CONFIG
    const [command, ...argv] = [...launcher, process.execPath, MAIN, ...args] as [string, ...Array<string>]
    execFile(command, argv, { cwd: ROOT, env: childEnv, timeout: 30_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : -1
      resolve({ code, stdout, stderr })
    })
  })
