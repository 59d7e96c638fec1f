/**
 * `cgn-agent check`'s question to the Python an engine's `python -m PACKAGE.module` command line runs (SGLang's
 * `python -m sglang.launch_server`): whether it has the package. `check` finds `python` on the engine's PATH, yet a
 * python without the package (the system's where the package is in a virtual environment's) makes every start die
 * "No module named sglang": the node in a crash loop. Asked of that python itself, as the spawn would run it (the
 * engine's environment and working directory), with importlib.util.find_spec of the top-level package, which
 * imports nothing; bounded apart from the host's filesystem checks (an interpreter that hangs must not hold `check`
 * nor be taken for a hung filesystem), and killed when the bound interrupts it.
 */
import { execFile } from "node:child_process"
import path from "node:path"
import { Effect } from "effect"

const FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) is not None else 3)"
/** The exit status FIND gives for a package it cannot find. */
const MISSING = 3
/** A python starts and answers in well under a second; a slow disk's first start in a few. */
export const PYTHON_TIMEOUT_MS = 5_000

export type ModuleFinding =
  | { readonly _tag: "Found" }
  | { readonly _tag: "Missing" }
  /** The interpreter could not be asked (it failed otherwise, or did not answer in time). */
  | { readonly _tag: "Unknown"; readonly reason: string }

/**
 * Whether `command` names a Python interpreter (`python`, `python3`, `/opt/venv/bin/python3.12`), the only kind
 * asked: in an engine.command such as `["numactl", "-m", "0", ...]` the `-m` is not Python's, and that program must
 * not be run with the question's arguments.
 */
export const isPython = (command: string): boolean => /^python(\d+(\.\d+)*)?$/.test(path.basename(command))

/** The top-level package a `-m` module is in: what must be importable for it to run. */
export const packageOf = (module: string): string => module.split(".")[0] ?? module

/**
 * Whether `python` (as the engine's spawn would resolve and run it) can import `module`'s package. Never fails; an
 * interpreter still running at PYTHON_TIMEOUT_MS is killed (SIGKILL) and the answer is Unknown.
 */
export const pythonModuleFinding = (
  python: string,
  module: string,
  env: Readonly<Record<string, string | undefined>>,
  cwd: string
): Effect.Effect<ModuleFinding> =>
  Effect.callback<ModuleFinding>((resume, signal) => {
    execFile(
      python,
      ["-c", FIND, packageOf(module)],
      { env, cwd, signal, killSignal: "SIGKILL", maxBuffer: 64 * 1024 },
      (error, _stdout, stderr) => {
        if (error === null) return resume(Effect.succeed({ _tag: "Found" }))
        if (error.code === MISSING) return resume(Effect.succeed({ _tag: "Missing" }))
        const why = stderr.trim().split("\n").at(-1) ?? ""
        resume(Effect.succeed({ _tag: "Unknown", reason: why === "" ? error.message : why }))
      }
    )
  }).pipe(
    Effect.timeoutOrElse({
      duration: PYTHON_TIMEOUT_MS,
      orElse: () =>
        Effect.succeed<ModuleFinding>({ _tag: "Unknown", reason: `no answer within ${PYTHON_TIMEOUT_MS / 1000} s` })
    })
  )
