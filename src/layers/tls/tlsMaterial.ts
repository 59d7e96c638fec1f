/**
 * The TLS material on disk: which files `[security]` names, and reading and checking them (parseable PEM,
 * certificate not expired, key matching the certificate, usable as a Node secure context). Every problem is
 * a TlsError naming the config key or CLI flag the file came from.
 */
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as tls from "node:tls"
import { Clock, Effect } from "effect"
import type { AgentConfig } from "../../services/config/Config.ts"
import { TlsError, type TlsMaterial } from "../../services/tls/Tls.ts"

export type Security = AgentConfig["security"]

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

/** One PEM file's bytes; a missing path is an error naming its key. */
export const readOne = (file: { readonly key: string; readonly path: string | undefined }) =>
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

/** Parses a PEM certificate and refuses one that expired before `now` (ms). */
export const parseCert = (
  pem: Buffer,
  file: { readonly key: string; readonly path: string | undefined },
  now: number
) =>
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
    // One after another: of several unreadable files the error names the first in this order, every time (read
    // concurrently, whichever read failed first was reported, and `check` printed a different key run to run).
    const [ca, cert, key] = yield* Effect.all([readOne(files.ca), readOne(files.cert), readOne(files.key)])
    const now = yield* Clock.currentTimeMillis
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

/** True when a re-read found the same bytes (nothing to push to the server). */
export const sameMaterial = (a: TlsMaterial, b: TlsMaterial) =>
  a.ca.equals(b.ca) && a.cert.equals(b.cert) && a.key.equals(b.key)
