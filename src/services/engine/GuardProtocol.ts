/**
 * The orphan guard's contract with the agent, pure: its command line and the JSON lines it reports on fd 3.
 * argv: `guard.ts --grace-ms N [--log-prefix P] -- <engine argv...>`. Reports, one JSON object a line:
 * `{"t":"spawned","pid":N}` (the engine's pid = its process group id), `{"t":"spawn-error","message":...}`,
 * `{"t":"exit","code":N|null,"signal":S|null}` (the engine leader's exit status),
 * `{"t":"stopped","outcome":O}` (how the guard's stop of the group ended; its last report).
 */

/** How a group stop ended: it was already gone, left on TERM, needed KILL, or survived even KILL. */
export const StopOutcomes = ["gone", "terminated", "killed", "survived"] as const
export type StopOutcome = (typeof StopOutcomes)[number]

export type GuardReport =
  | { readonly t: "spawned"; readonly pid: number }
  | { readonly t: "spawn-error"; readonly message: string }
  | { readonly t: "exit"; readonly code: number | null; readonly signal: string | null }
  | { readonly t: "stopped"; readonly outcome: StopOutcome }

/** The fd the guard writes its reports to (stdio[3] of the guard). */
export const REPORT_FD = 3

export interface GuardArgs {
  readonly graceMs: number
  readonly argv: ReadonlyArray<string>
}

export const buildGuardArgs = (args: GuardArgs): Array<string> => [
  "--grace-ms",
  String(args.graceMs),
  "--",
  ...args.argv
]

export const parseGuardArgs = (args: ReadonlyArray<string>): GuardArgs | string => {
  const sep = args.indexOf("--")
  if (sep < 0) return "missing `--` before the engine command"
  const argv = args.slice(sep + 1)
  if (argv.length === 0) return "no engine command after `--`"
  const head = args.slice(0, sep)
  let graceMs = 30_000
  for (let i = 0; i < head.length; i++) {
    if (head[i] === "--grace-ms") {
      const n = Number(head[++i])
      if (!Number.isFinite(n) || n < 0) return `invalid --grace-ms ${head[i]}`
      graceMs = n
    } else return `unknown guard option ${head[i]}`
  }
  return { graceMs, argv }
}

export const encodeReport = (report: GuardReport): string => `${JSON.stringify(report)}\n`

/** Decodes one report line; undefined for anything that is not a well-formed report. */
export const decodeReport = (line: string): GuardReport | undefined => {
  let v: unknown
  try {
    v = JSON.parse(line)
  } catch {
    return undefined
  }
  if (typeof v !== "object" || v === null) return undefined
  const o = v as Record<string, unknown>
  if (o.t === "spawned" && typeof o.pid === "number") return { t: "spawned", pid: o.pid }
  if (o.t === "spawn-error" && typeof o.message === "string") return { t: "spawn-error", message: o.message }
  if (o.t === "exit") {
    const code = typeof o.code === "number" ? o.code : null
    const signal = typeof o.signal === "string" ? o.signal : null
    return { t: "exit", code, signal }
  }
  const outcome = StopOutcomes.find((x) => x === o.outcome)
  if (o.t === "stopped" && outcome !== undefined) return { t: "stopped", outcome }
  return undefined
}
