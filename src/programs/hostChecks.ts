/**
 * `cgn-agent check`'s checks of the host beyond `preflight` (check.ts): what `run` would only find out by failing
 * after it started. Nothing is created or started: each check reads (but for the probe file of an existing state_dir).
 * - The engine's executable (a spawned engine only), found as its spawn finds it: a path with a slash from the
 *   working directory, else the first executable file of that name in the engine's PATH. `run` would fail to spawn it
 *   (ENOENT) and restart it for ever, the node unhealthy. For an engine run as `python -m package.module` (SGLang),
 *   that python must also have the package (pythonModule.ts).
 * - `agent.state_dir` (layers/stateDir/stateDirChecks.ts): the directory itself, else its first existing ancestor, must
 *   be a writable directory, not on a kernel filesystem (procfs, sysfs: mkdir there fails, and as root every
 *   permission check passes). `run` of a spawned engine cannot start without it (the state lock and the pid file);
 *   with none it keeps the cordon and the GPUs' Xids there only. One that exists must also take a small file,
 *   written and removed (a full filesystem).
 * - `models."name".path` (a spawned engine only): what the engine needs it to be, a GGUF file for llama.cpp, a model
 *   directory (or GGUF file) for vLLM and SGLang (modelPath.ts). `run` would spawn an engine that exits at every start.
 * - `kv.uds`'s directory, when it exists (the socket may appear later): the agent connects only to a socket in a
 *   directory others cannot take it over in (stateFiles.ts socketDirDistrust); a warning, as kvcached makes the socket.
 * - what the engine's environment must give it, as its backend says (LaunchPlan.environmentNeed): KVBM with no cache
 *   tier refuses to start (ai-dynamo/dynamo lib/llm/src/block_manager/distributed/leader.rs,
 *   KvbmLeaderConfig::sanity_check: "At least one cache tier must be configured"), so vLLM exits at every start.
 * Each finding is an error (check exits 2: `run` would not serve) or a warning (the exit stays 0).
 */
import { constants } from "node:fs"
import * as fsp from "node:fs/promises"
import * as path from "node:path"
import { Effect } from "effect"
import { stateDirLine, stateDirProblem, stateDirWriteProblem } from "../layers/stateDir/stateDirChecks.ts"
import { socketDirDistrust, socketDistrust } from "../layers/stateDir/stateFiles.ts"
import type { AgentConfig } from "../services/config/Config.ts"
import type { LaunchPlan } from "../services/engine/Engine.ts"
import { engineEnvironment } from "../services/engine/EngineEnvironment.ts"
import { codeOf, modelPathFinding } from "./modelPath.ts"
import { isPython, packageOf, pythonModuleFinding } from "./pythonModule.ts"

export interface HostFindings {
  readonly errors: ReadonlyArray<string>
  readonly warnings: ReadonlyArray<string>
}

type Env = Readonly<Record<string, string | undefined>>

/** The search path when the engine's environment has no PATH: libuv's default (src/unix/process.c _PATH_DEFPATH). */
const DEFAULT_PATH = "/usr/bin:/bin"

/** Why `file` cannot be executed, or undefined when it can (a regular file with an execute bit for us). */
const notExecutable = async (file: string): Promise<string | undefined> => {
  try {
    if (!(await fsp.stat(file)).isFile()) return `${file} is not a file`
    await fsp.access(file, constants.X_OK)
    return undefined
  } catch (e) {
    const code = codeOf(e)
    if (code === "ENOENT" || code === "ENOTDIR") return `${file} does not exist`
    if (code === "EACCES") return `${file} is not executable`
    return `${file}: ${code}`
  }
}

/**
 * Why `command` would not start, or undefined when it is found. Resolved as libuv's spawn resolves it (Node's
 * child_process.spawn, no shell; src/unix/process.c uv__spawn_resolve_and_spawn / execvp): a name with a slash is
 * a path (relative to `cwd`), any other is searched in the PATH of the environment the engine gets, an empty entry
 * being the working directory.
 */
export const commandProblem = async (command: string, env: Env, cwd: string): Promise<string | undefined> => {
  if (command === "") return "the command is empty"
  if (command.includes("/")) return notExecutable(path.resolve(cwd, command))
  const search = env.PATH ?? DEFAULT_PATH
  for (const dir of search.split(":")) {
    if ((await notExecutable(path.join(dir === "" ? cwd : dir, command))) === undefined) return undefined
  }
  return `not found on the engine's PATH (${search})`
}

/** How long the host's filesystems get to answer (a hung network mount must not hold check). */
const READ_TIMEOUT_MS = 10_000

/**
 * The findings on this host. `plan`: the launch plan as `run` renders it; `offline`: away from the host, where only
 * the file is read (the engine's executable and the state dir are skipped, and an environment need (a KVBM tier)
 * the host's environment may still meet is a warning).
 */
export const hostFindings = (
  c: AgentConfig,
  plan: LaunchPlan,
  options: { readonly offline: boolean; readonly env?: Env; readonly cwd?: string }
): Effect.Effect<HostFindings> =>
  Effect.promise(async (): Promise<HostFindings & { readonly ask?: PythonAsk }> => {
    const errors: Array<string> = []
    const warnings: Array<string> = []
    const cwd = options.cwd ?? process.cwd()
    const env = engineEnvironment(options.offline ? {} : (options.env ?? process.env), plan.env)
    const need = plan.environmentNeed
    if (need !== undefined && !need.met(env)) {
      ;(options.offline ? warnings : errors).push(
        options.offline ? `${need.problem}, unless the host's environment sets one` : need.problem
      )
    }
    if (options.offline) return { errors, warnings }
    let python: PythonAsk | undefined
    const command = plan.argv[0]
    if (plan.spawns && command !== undefined) {
      const problem = await commandProblem(command, env, cwd)
      const key =
        c.engine.command === undefined
          ? `engine.kind = "${c.engine.kind}" runs "${command}" (engine.command is unset)`
          : `engine.command[0] = "${command}"`
      if (problem !== undefined)
        errors.push(`${key}: ${problem}; run could not spawn the engine and would restart it again and again`)
      // `python -m package.module`, the engine's own (SGLang's) or engine.command's (a virtual environment's python):
      // that python must have the package, asked below, apart from the filesystem's bound
      const module = plan.argv[1] === "-m" ? plan.argv[2] : undefined
      if (problem === undefined && module !== undefined && isPython(command))
        python = { command, module, key, env, cwd }
    }
    const model = plan.spawns ? await modelPathFinding(c, cwd) : undefined
    if (model !== undefined) (model.error ? errors : warnings).push(model.line)
    const dir = (await stateDirProblem(c.agent.state_dir, cwd)) ?? (await stateDirWriteProblem(c.agent.state_dir, cwd))
    if (dir !== undefined) {
      const line = stateDirLine(c.agent.state_dir, dir)
      // a spawned engine's start needs it (lock, pid file); a proxied server's run keeps only the cordon there
      if (plan.spawns) errors.push(line)
      else warnings.push(`${line} (a cordon and the GPUs' Xids could not be kept across restarts)`)
    }
    const uds = c.kv.events && c.kv.uds !== undefined ? path.resolve(cwd, c.kv.uds) : undefined
    const udsDir = uds === undefined ? undefined : await socketDirDistrust(path.dirname(uds))
    if (udsDir !== undefined)
      warnings.push(
        `kv.uds = "${c.kv.uds}": ${udsDir}; run will not connect to a socket there (its directory must be writable ` +
          "by its owner only, or sticky like /tmp, and owned by the agent's user or root, as every directory above it)"
      )
    // A socket there already (kvcached makes it; none yet is no finding) that run would refuse: another user's, a
    // link, not a socket.
    const present =
      uds !== undefined &&
      udsDir === undefined &&
      (await fsp.lstat(uds).then(
        () => true,
        () => false
      ))
    const udsSock = present ? await socketDistrust(uds) : undefined
    if (udsSock !== undefined) warnings.push(`kv.uds = "${c.kv.uds}": ${udsSock}; run will not connect to it`)
    return { errors, warnings, ...(python === undefined ? {} : { ask: python }) }
  }).pipe(
    Effect.timeoutOrElse({
      duration: READ_TIMEOUT_MS,
      orElse: () =>
        Effect.succeed({
          errors: [
            `the host's filesystems gave no answer within ${READ_TIMEOUT_MS / 1000} s (engine command, model path, state_dir)`
          ],
          warnings: []
        })
    }),
    Effect.flatMap((r) => ("ask" in r && r.ask !== undefined ? withPython(r, r.ask) : Effect.succeed(r)))
  )

/** The engine's `python -m` module to ask its python about (pythonModule.ts), as its spawn would run it. */
interface PythonAsk {
  readonly command: string
  readonly module: string
  /** The config key the finding names. */
  readonly key: string
  readonly env: Env
  readonly cwd: string
}

/** `found` with what the engine's python says of its module's package. */
const withPython = (found: HostFindings, ask: PythonAsk): Effect.Effect<HostFindings> =>
  Effect.map(pythonModuleFinding(ask.command, ask.module, ask.env, ask.cwd), (answer) => {
    const pkg = packageOf(ask.module)
    if (answer._tag === "Missing")
      return {
        errors: [
          ...found.errors,
          `${ask.key}: that ${ask.command} has no module ${pkg} (importlib could not find it); run would start an engine that dies "No module named ${pkg}" again and again: install ${pkg} for it, or put the python that has it first on the PATH (or in engine.command)`
        ],
        warnings: found.warnings
      }
    if (answer._tag === "Unknown")
      return {
        errors: found.errors,
        warnings: [
          ...found.warnings,
          `${ask.key}: could not ask ${ask.command} whether it has the module ${pkg}: ${answer.reason}`
        ]
      }
    return { errors: found.errors, warnings: found.warnings }
  })
