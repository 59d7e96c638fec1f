/**
 * Live Tls: reads and checks the PEM files (tlsMaterial.ts) and serves them as a cell (materialCell.ts) the
 * gRPC server subscribes to, applying each change with the HTTP/2 server's `setSecureContext`. Watches the
 * files and their directories (debounced) and SIGHUP (watchChanges.ts); an invalid new file is logged, the
 * old material kept, and the files read again with backoff until they are valid. `allowed_client_names`:
 * clientNameCheck.ts. Client credentials: clientCredentials.ts.
 */
import { Duration, Effect, Layer, Queue, Random, Semaphore, Stream } from "effect"
import { Config } from "../../services/config/Config.ts"
import { jitteredBackoffMs } from "../../services/retry/Backoff.ts"
import { ALLOWED_CLIENT_NAMES } from "../../services/tls/ClientNames.ts"
import { Tls, type TlsError, type TlsService } from "../../services/tls/Tls.ts"
import { background, RESTART } from "../observability/backgroundFiber.ts"
import { effectLog, makeClientNameCheck } from "./clientNameCheck.ts"
import { MaterialCell } from "./materialCell.ts"
import { certificateNotAfter, readMaterial, type Security, sameMaterial, securityFiles } from "./tlsMaterial.ts"
import { watchChanges } from "./watchChanges.ts"

export interface TlsOptions {
  /** Watch the files and their directories (default true). */
  readonly watch?: boolean
  /** Reload on SIGHUP (default true). */
  readonly sighup?: boolean
  /** Quiet time after the last file event before re-reading (default 100 ms: writers touch files in bursts). */
  readonly debounce?: Duration.Input
  /**
   * After a failed reload, the files are read again after this delay (jittered down to half), doubling up to
   * `retryMax` (default 1 s),
   * until one succeeds: a rotation caught half-written (certificate new, key not yet), or a certificate issued a
   * little ahead of this host's clock, is picked up without another file event or SIGHUP.
   */
  readonly retryInitial?: Duration.Input
  /** The longest delay between those retries (default 1 minute). */
  readonly retryMax?: Duration.Input
  /**
   * The files are also re-read this often whatever the watches say (default 1 minute): a watch can be missing
   * (inotify's limit reached, a filesystem without inotify such as NFS) or die silently, and a certificate that
   * was rotated unseen would expire while being served. An unchanged read changes nothing.
   */
  readonly recheck?: Duration.Input
}

/** The Tls service for a `[security]` section; watchers and the SIGHUP handler live in the scope. */
export const make = (security: Security, options: TlsOptions = {}) =>
  Effect.gen(function* () {
    if (!security.require_mtls) {
      return Tls.of({
        enabled: false,
        serverTls: undefined,
        reload: Effect.succeed(false),
        hangup: Effect.as(
          Effect.logInfo("SIGHUP: no certificates to reload (security.require_mtls is off)"),
          undefined
        ),
        generation: Effect.succeed(0),
        lastError: Effect.succeed(undefined),
        status: Effect.succeed({ enabled: false, generation: 0 })
      })
    }
    const files = securityFiles(security)
    const cell = new MaterialCell(yield* readMaterial(files, "serverAuth"))
    const clientNames = yield* clientNamesOf(security)
    let generation = 1
    let notAfter = certificateNotAfter(cell.current())
    let lastError: TlsError | undefined
    // failed reloads in a row: paces the retries
    let failures = 0
    const retryWanted = yield* Queue.sliding<void>(1)
    // One reload at a time: a SIGHUP and a file event together would otherwise read concurrently, and the slower
    // read (of older files) could be applied after the newer one, or leave lastError set while the new material
    // is served.
    const oneAtATime = yield* Semaphore.make(1)

    const reload: TlsService["reload"] = readMaterial(files, "serverAuth").pipe(
      Effect.tapError((e) =>
        Effect.sync(() => {
          lastError = e
          failures++
          Queue.offerUnsafe(retryWanted, undefined)
        })
      ),
      Effect.map((next) => {
        lastError = undefined
        failures = 0
        if (sameMaterial(cell.current(), next)) return false
        generation++
        cell.update(next)
        notAfter = certificateNotAfter(next)
        return true
      }),
      oneAtATime.withPermits(1)
    )

    const paths = [files.ca.path, files.cert.path, files.key.path].filter((p): p is string => p !== undefined)
    const events = yield* Queue.sliding<void>(1)
    const unwatched = yield* watchChanges(paths, options, events)
    const recheck = Duration.fromInputUnsafe(options.recheck ?? "1 minute")
    for (const { path, reason } of unwatched) {
      yield* Effect.logWarning("tls: cannot watch the certificates' directory; re-reading it periodically", {
        path,
        reason,
        every: Duration.format(recheck)
      })
    }
    // Each loop below runs again after a defect, said: a certificate rotated on disk must not stop being taken up.
    const reloads = (what: string) =>
      background(what, "rotated certificates are no longer taken up", { restart: RESTART })
    yield* Queue.offer(events, undefined).pipe(
      Effect.delay(recheck),
      Effect.forever,
      reloads("the TLS files' periodic re-read"),
      Effect.forkScoped
    )
    // One warning per distinct problem: every change in the watched directories re-reads the files, and a log
    // file kept there fed a broken certificate's warning back to itself (~10 lines a second). Shared with the SIGHUP's
    // reload (`hangup`): its warning is not said again by the retry it starts, nor the other way.
    const warned: { problem: string | undefined } = { problem: undefined }
    yield* Stream.fromQueue(events).pipe(
      Stream.debounce(options.debounce ?? "100 millis"),
      Stream.runForEach(() =>
        reload.pipe(
          Effect.tap((changed) => {
            // the files valid again but the same as served (the old ones put back): said, or the log ends on the warning
            const recovered = warned.problem !== undefined
            warned.problem = undefined
            if (changed) return Effect.logInfo("tls: certificates reloaded")
            return recovered
              ? Effect.logInfo("tls: the certificate files are valid again (the ones served)")
              : Effect.void
          }),
          Effect.catch((e) => {
            const repeated = e.message === warned.problem
            warned.problem = e.message
            const line = `tls: keeping the previous certificates: ${e.message}`
            return repeated ? Effect.logDebug(line) : Effect.logWarning(line)
          })
        )
      ),
      reloads("the TLS reload on file changes"),
      Effect.forkScoped
    )

    // A failed reload (from a file event, SIGHUP or a caller) is tried again, with backoff, until one succeeds.
    const initialMs = Duration.toMillis(Duration.fromInputUnsafe(options.retryInitial ?? "1 second"))
    const maxMs = Duration.toMillis(Duration.fromInputUnsafe(options.retryMax ?? "1 minute"))
    yield* Stream.fromQueue(retryWanted).pipe(
      Stream.runForEach(() =>
        Effect.flatMap(Random.next, (r) => Effect.sleep(jitteredBackoffMs(failures, maxMs, r, initialMs))).pipe(
          Effect.andThen(Effect.suspend(() => (lastError === undefined ? Effect.void : Queue.offer(events, undefined))))
        )
      ),
      reloads("the TLS reload's retry"),
      Effect.forkScoped
    )

    // A problem a file event found first is not warned of again: the SIGHUP's answer then says at info that the
    // certificates are kept, pointing at where the reason stays (`/status` tls.reloadError).
    const hangup = reload.pipe(
      Effect.flatMap((changed) => {
        warned.problem = undefined
        return Effect.as(
          Effect.logInfo(changed ? "SIGHUP: certificates reloaded" : "SIGHUP: certificates unchanged"),
          undefined
        )
      }),
      Effect.catch((e) => {
        const repeated = warned.problem === e.message
        warned.problem = e.message
        return Effect.as(
          repeated
            ? Effect.logInfo(
                "SIGHUP: keeping the previous certificates: the files still have the problem warned of (/status tls.reloadError)"
              )
            : Effect.logWarning(`SIGHUP: keeping the previous certificates: ${e.message}`),
          e.message
        )
      })
    )

    return Tls.of({
      enabled: true,
      serverTls:
        clientNames === undefined
          ? cell
          : { current: cell.current, subscribe: cell.subscribe, clientNames: clientNames.check },
      reload,
      hangup,
      generation: Effect.sync(() => generation),
      lastError: Effect.sync(() => lastError),
      status: Effect.sync(() => ({
        enabled: true,
        generation,
        certificateNotAfter: notAfter,
        ...(lastError === undefined ? {} : { reloadError: lastError.message }),
        ...(clientNames === undefined ? {} : { clientsRefused: clientNames.refused() })
      }))
    })
  })

/**
 * `security.allowed_client_names`' check, undefined for none or an empty list; says at start which clients are
 * served. Info, not a warning, without a list: a CA of the agents' clients' own (the README's advice) is sound, and
 * the agent cannot tell it from a shared one; a warning every correct deployment prints teaches to skip warnings.
 */
const clientNamesOf = (security: Security) =>
  Effect.gen(function* () {
    const names = security.allowed_client_names ?? []
    if (names.length === 0) {
      yield* Effect.logInfo(
        `tls: mTLS on; any client certificate that chains to security.ca_file may call (${ALLOWED_CLIENT_NAMES} is not set)`
      )
      return undefined
    }
    yield* Effect.logInfo(`tls: mTLS on; clients allowed by ${ALLOWED_CLIENT_NAMES}: ${names.join(", ")}`)
    const run = Effect.runCallbackWith(yield* Effect.context<never>())
    return makeClientNameCheck(names, effectLog(run))
  })

/**
 * Tls from `[security]` of the Config. Fails at start with a TlsError naming the key. SIGHUP is the daemon's
 * (programs/runMain.ts `reloadOnHangup`, which runs `hangupReload`), so it reaches a reload in every mode.
 */
export const layer: Layer.Layer<Tls, TlsError, Config> = Layer.effect(
  Tls,
  Effect.flatMap(Config, (config) => make(config.security, { sighup: false }))
)

/**
 * What SIGHUP reloads: the certificates when TLS is on (an invalid new file is logged and the old material
 * kept; the service's `hangup`). The log level is layers/observability/Logging.ts `hangupReload`. Never fails: a reload
 * must not end the daemon.
 */
export const hangupReload: Effect.Effect<string | undefined, never, Tls> = Effect.flatMap(Tls, (tls) => tls.hangup)

/** Tls for an explicit `[security]` section and options (tests). */
export const layerWith = (security: Security, options: TlsOptions = {}): Layer.Layer<Tls, TlsError> =>
  Layer.effect(Tls, make(security, options))
