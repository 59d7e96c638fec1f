/**
 * SIGHUP and the config file: the file is taken only when `run` would take it at a start. It must decode, and pass
 * the preflight `run` and `check` make (check.ts: the admin token off loopback, the TLS and etcd files): a file that
 * decodes but that the next start would refuse (exit 2) had its log level applied and its other changes promised "at
 * the next start" before. Then the log level is applied (Logging.ts hangupReload) and the changes it cannot apply are
 * named (layers/config/configChanges.ts hangupNotice). The TLS files in use are re-read whatever the file says
 * (layers/tls/Tls.ts), as they name the running config's files.
 */
import { Effect, Result } from "effect"
import { loadConfigFile } from "../layers/config/Config.ts"
import { hangupNotice } from "../layers/config/configChanges.ts"
import * as Logging from "../layers/observability/Logging.ts"
import type { AgentConfig } from "../services/config/Config.ts"
import { preflight } from "./check.ts"

/**
 * `said`: the problems the SIGHUP's TLS reloads just warned of (main.ts: the certificates' and etcd's files first): a
 * garbage certificate file said again here made one cause three warnings. Only what they did not say is warned of.
 */
export const hangupConfig = (running: AgentConfig, said: ReadonlyArray<string> = []) =>
  Effect.gen(function* () {
    if (running.file === undefined) return
    const read = yield* Effect.result(loadConfigFile(running.file))
    if (Result.isSuccess(read)) {
      const refused = yield* Effect.result(preflight(read.success))
      if (Result.isFailure(refused)) {
        const problems = refused.failure.problems.filter((p) => !said.includes(p))
        return yield* problems.length === 0
          ? Effect.logInfo(
              "SIGHUP: the config file would be refused at the next start for the TLS files' problem said above; nothing in it applied, log level kept"
            )
          : Effect.logWarning(
              "SIGHUP: the config file would be refused at the next start; nothing in it applied, log level kept",
              { problems }
            )
      }
    }
    yield* Logging.hangupReload(running.file)
    yield* hangupNotice(running)
  })
