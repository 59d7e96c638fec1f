/**
 * Live Tls: reads and checks the PEM files, serves them through grpc-js's certificate-provider credentials
 * (`experimental.createCertificateProviderServerCredentials`), whose listeners call the HTTP/2 server's
 * `setSecureContext` — the one way grpc-js changes certificates after bind. Watches the files and their
 * directories (debounced) and SIGHUP; an invalid new file is logged and the old material kept.
 * Also client credentials for the `generate` client and tests.
 */
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as path from "node:path"
import * as tls from "node:tls"
import { ChannelCredentials, experimental, ServerCredentials } from "@grpc/grpc-js"
import { type Duration, Effect, Layer, Queue, Stream } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { Config } from "../../services/config/Config.ts"
import { Tls, TlsError, type TlsMaterial, type TlsService } from "../../services/tls/Tls.ts"

type Security = AgentConfig["security"]

/** Where each file comes from: the key names errors use (config keys or CLI flags). */
export interface TlsFiles {
  readonly ca: { readonly key: string; readonly path: string | undefined }
  readonly cert: { readonly key: string; readonly path: string | undefined }
  readonly key: { readonly key: string; readonly path: string | undefined }
}

export const securityFiles = (security: Security): TlsFiles => ({
  ca: { key: "security.ca_file", path: security.ca_file },
  cert: { key: "security.cert_file", path: security.cert_file },
  key: { key: "security.key_file", path: security.key_file }
})

const readOne = (file: { readonly key: string; readonly path: string | undefined }) =>
  Effect.gen(function* () {
    const where = file.path
    if (where === undefined || where === "") {
      return yield* new TlsError({ key: file.key, reason: "required when security.require_mtls = true" })
    }
    return yield* Effect.tryPromise({
      try: () => fs.promises.readFile(where),
      catch: (e) =>
        new TlsError({ key: file.key, path: where, reason: `cannot read: ${(e as NodeJS.ErrnoException).message}` })
    })
  })

const parseCert = (pem: Buffer, file: { readonly key: string; readonly path: string | undefined }, now: number) =>
  Effect.try({
    try: () => new crypto.X509Certificate(pem),
    catch: (e) => new TlsError({ key: file.key, ...pathOf(file), reason: `not a PEM certificate: ${String(e)}` })
  }).pipe(
    Effect.filterOrFail(
      (x) => Date.parse(x.validTo) > now,
      (x) => new TlsError({ key: file.key, ...pathOf(file), reason: `certificate expired on ${x.validTo}` })
    )
  )

const pathOf = (file: { readonly path: string | undefined }) => (file.path === undefined ? {} : { path: file.path })

/** Reads and checks the three files: parseable PEM, not expired, key matching the certificate. */
export const readMaterial = (files: TlsFiles): Effect.Effect<TlsMaterial, TlsError> =>
  Effect.gen(function* () {
    const [ca, cert, key] = yield* Effect.all([readOne(files.ca), readOne(files.cert), readOne(files.key)], {
      concurrency: "unbounded"
    })
    const now = Date.now()
    yield* parseCert(ca, files.ca, now)
    const leaf = yield* parseCert(cert, files.cert, now)
    const privateKey = yield* Effect.try({
      try: () => crypto.createPrivateKey(key),
      catch: (e) => new TlsError({ key: files.key.key, ...pathOf(files.key), reason: `not a PEM private key: ${e}` })
    })
    if (!leaf.checkPrivateKey(privateKey)) {
      return yield* new TlsError({
        key: files.key.key,
        ...pathOf(files.key),
        reason: `does not belong to the certificate in ${files.cert.key}`
      })
    }
    yield* Effect.try({
      try: () => tls.createSecureContext({ ca, cert, key }),
      catch: (e) => new TlsError({ key: files.cert.key, ...pathOf(files.cert), reason: `unusable: ${e}` })
    })
    return { ca, cert, key }
  })

/**
 * A grpc-js CertificateProvider for both roles (CA and identity), pushing each new material to the listeners.
 * Used as both providers, so the order of createCertificateProviderServerCredentials' arguments (whose
 * declared names and implementation disagree in 1.14) does not matter.
 */
class ReloadableProvider implements experimental.CertificateProvider {
  #material: TlsMaterial
  readonly #ca = new Set<experimental.CaCertificateUpdateListener>()
  readonly #identity = new Set<experimental.IdentityCertificateUpdateListener>()
  constructor(material: TlsMaterial) {
    this.#material = material
  }
  update(material: TlsMaterial): void {
    this.#material = material
    for (const l of this.#ca) l({ caCertificate: material.ca })
    for (const l of this.#identity) l({ certificate: material.cert, privateKey: material.key })
  }
  // grpc-js reads no initial options: it expects the current material pushed once a listener is added, and on
  // the next tick, because it registers the server's own watcher only after adding these listeners.
  addCaCertificateListener(l: experimental.CaCertificateUpdateListener): void {
    this.#ca.add(l)
    const material = this.#material
    process.nextTick(() => this.#ca.has(l) && l({ caCertificate: material.ca }))
  }
  removeCaCertificateListener(l: experimental.CaCertificateUpdateListener): void {
    this.#ca.delete(l)
  }
  addIdentityCertificateListener(l: experimental.IdentityCertificateUpdateListener): void {
    this.#identity.add(l)
    const material = this.#material
    process.nextTick(() => this.#identity.has(l) && l({ certificate: material.cert, privateKey: material.key }))
  }
  removeIdentityCertificateListener(l: experimental.IdentityCertificateUpdateListener): void {
    this.#identity.delete(l)
  }
}

const sameMaterial = (a: TlsMaterial, b: TlsMaterial) =>
  a.ca.equals(b.ca) && a.cert.equals(b.cert) && a.key.equals(b.key)

export interface TlsOptions {
  /** Watch the files and their directories (default true). */
  readonly watch?: boolean
  /** Reload on SIGHUP (default true). */
  readonly sighup?: boolean
  /** Quiet time after the last file event before re-reading (default 100 ms: writers touch files in bursts). */
  readonly debounce?: Duration.Input
}

/**
 * Offers to `queue` on a change of a watched file or directory (file watches re-armed on each event: a replaced
 * file is a new inode) and on SIGHUP. Registered before this effect returns; removed with the scope.
 */
const watchChanges = (files: ReadonlyArray<string>, options: TlsOptions, queue: Queue.Queue<void>) =>
  Effect.asVoid(
    Effect.acquireRelease(
      Effect.sync(() => {
        const watchers = new Map<string, fs.FSWatcher>()
        const arm = (target: string) => {
          watchers.get(target)?.close()
          try {
            const w = fs.watch(target, { persistent: false }, () => onEvent())
            w.on("error", () => w.close())
            watchers.set(target, w)
          } catch {
            watchers.delete(target) // a file mid-swap; the directory watch still reports it
          }
        }
        const onEvent = () => {
          for (const f of files) arm(f)
          Queue.offerUnsafe(queue, undefined)
        }
        if (options.watch !== false) for (const t of [...new Set(files.map((f) => path.dirname(f))), ...files]) arm(t)
        const onHup = () => Queue.offerUnsafe(queue, undefined)
        if (options.sighup !== false) process.on("SIGHUP", onHup)
        return { watchers, onHup }
      }),
      ({ watchers, onHup }) =>
        Effect.sync(() => {
          process.off("SIGHUP", onHup)
          for (const w of watchers.values()) w.close()
        })
    )
  )

/** The Tls service for a `[security]` section; watchers and the SIGHUP handler live in the scope. */
export const make = (security: Security, options: TlsOptions = {}) =>
  Effect.gen(function* () {
    if (!security.require_mtls) {
      return Tls.of({
        enabled: false,
        serverCredentials: ServerCredentials.createInsecure(),
        reload: Effect.succeed(false),
        generation: Effect.succeed(0),
        lastError: Effect.succeed(undefined)
      })
    }
    const files = securityFiles(security)
    let current = yield* readMaterial(files)
    let generation = 1
    let lastError: TlsError | undefined
    const provider = new ReloadableProvider(current)
    const serverCredentials = experimental.createCertificateProviderServerCredentials(provider, provider, true)

    const reload: TlsService["reload"] = readMaterial(files).pipe(
      Effect.tapError((e) =>
        Effect.sync(() => {
          lastError = e
        })
      ),
      Effect.map((next) => {
        lastError = undefined
        if (sameMaterial(current, next)) return false
        current = next
        generation++
        provider.update(next)
        return true
      })
    )

    const paths = [files.ca.path, files.cert.path, files.key.path].filter((p): p is string => p !== undefined)
    const events = yield* Queue.sliding<void>(1)
    yield* watchChanges(paths, options, events)
    yield* Stream.fromQueue(events).pipe(
      Stream.debounce(options.debounce ?? "100 millis"),
      Stream.runForEach(() =>
        reload.pipe(
          Effect.tap((changed) => (changed ? Effect.logInfo("tls: certificates reloaded") : Effect.void)),
          Effect.catch((e) => Effect.logWarning(`tls: keeping the previous certificates: ${e.message}`))
        )
      ),
      Effect.forkScoped
    )

    return Tls.of({
      enabled: true,
      serverCredentials,
      reload,
      generation: Effect.sync(() => generation),
      lastError: Effect.sync(() => lastError)
    })
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
 * kept). The log level is layers/observability/Logging.ts `hangupReload`. Never fails: a reload must not end the daemon.
 */
export const hangupReload: Effect.Effect<void, never, Tls> = Effect.flatMap(Tls, (tls) =>
  tls.enabled
    ? tls.reload.pipe(
        Effect.flatMap((changed) =>
          Effect.logInfo(changed ? "SIGHUP: certificates reloaded" : "SIGHUP: certificates unchanged")
        ),
        Effect.catch((e) => Effect.logWarning(`SIGHUP: keeping the previous certificates: ${e.message}`))
      )
    : Effect.logInfo("SIGHUP: nothing to reload (security.require_mtls is off)")
)

/** Tls for an explicit `[security]` section and options (tests). */
export const layerWith = (security: Security, options: TlsOptions = {}): Layer.Layer<Tls, TlsError> =>
  Layer.effect(Tls, make(security, options))

// ---------------------------------------------------------------------------------------------------------
// Client side

/** Client credentials: TLS trusting `ca`, presenting `cert`/`key` when given; plaintext without `ca`. */
export const clientCredentials = (material?: Partial<TlsMaterial>): ChannelCredentials =>
  material?.ca === undefined
    ? ChannelCredentials.createInsecure()
    : ChannelCredentials.createSsl(material.ca, material.key ?? null, material.cert ?? null)

export interface ClientTlsFiles {
  readonly caFile?: string | undefined
  readonly certFile?: string | undefined
  readonly keyFile?: string | undefined
}

/**
 * Client credentials from files (the `generate` client's `--tls-ca`, `--tls-cert`, `--tls-key`). No files:
 * plaintext. A cert without a key (or the reverse) is an error naming the flag.
 */
export const loadClientCredentials = (
  files: ClientTlsFiles,
  keys: { readonly ca: string; readonly cert: string; readonly key: string } = {
    ca: "--tls-ca",
    cert: "--tls-cert",
    key: "--tls-key"
  }
): Effect.Effect<ChannelCredentials, TlsError> =>
  Effect.gen(function* () {
    if (files.caFile === undefined && files.certFile === undefined && files.keyFile === undefined) {
      return ChannelCredentials.createInsecure()
    }
    if ((files.certFile === undefined) !== (files.keyFile === undefined)) {
      const missing = files.certFile === undefined ? keys.cert : keys.key
      return yield* new TlsError({
        key: missing,
        reason: `required together with ${missing === keys.cert ? keys.key : keys.cert}`
      })
    }
    const caFile = files.caFile
    if (files.certFile === undefined || files.keyFile === undefined) {
      const ca = yield* readOne({ key: keys.ca, path: caFile })
      yield* parseCert(ca, { key: keys.ca, path: caFile }, Date.now())
      return clientCredentials({ ca })
    }
    if (caFile === undefined) {
      // No CA given: trust the system roots, still presenting the client certificate.
      const [cert, key] = yield* Effect.all([
        readOne({ key: keys.cert, path: files.certFile }),
        readOne({ key: keys.key, path: files.keyFile })
      ])
      return ChannelCredentials.createSsl(null, key, cert)
    }
    const material = yield* readMaterial({
      ca: { key: keys.ca, path: caFile },
      cert: { key: keys.cert, path: files.certFile },
      key: { key: keys.key, path: files.keyFile }
    })
    return clientCredentials(material)
  })
