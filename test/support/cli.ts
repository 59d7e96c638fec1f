// The cgn-agent binary run as a subprocess, the way a user runs it: exit code and output (the build, or the source when
// the build is stale: entries.ts). Shared by the CLI, gRPC and mTLS tests.
import { execFile } from "node:child_process"
import * as path from "node:path"
import { cliEntry } from "./entries.ts"

const ROOT = path.join(import.meta.dirname, "..", "..")

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
    const [command, ...argv] = [...launcher, process.execPath, cliEntry(), ...args] as [string, ...Array<string>]
    execFile(command, argv, { cwd: ROOT, env: childEnv, timeout: 30_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : -1
      resolve({ code, stdout, stderr })
    })
  })
