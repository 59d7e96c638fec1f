/**
 * The TLS material on disk: which files `[security]` names, and reading and checking them (parseable PEM,
 * certificates valid now: not expired, not yet to come, every certificate of a CA bundle parsed and one of them
 * valid; key matching the certificate; usable as a Node secure context). Every problem is a TlsError naming the
 * config key or CLI flag the file came from. parseCaBundle and checkKeyPair check [cluster]'s etcd files too
 * (layers/registry/etcdClient.ts).
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

/**
 * Why a certificate valid from `notBefore` to `notAfter` (ms) cannot be used at `now`, or undefined when it can.
 * A not-yet-valid certificate is refused like an expired one: peers refuse it as well ("certificate is not yet
 * valid"), so serving it in place of a good one (a pre-issued certificate, an issuer's clock ahead) breaks mTLS.
 */
export const validityProblem = (
  notBefore: number,
  notAfter: number,
  now: number,
  text: { readonly validFrom: string; readonly validTo: string }
): string | undefined => {
  if (!(now < notAfter)) return `certificate expired on ${text.validTo}`
  if (now < notBefore) return `certificate not valid before ${text.validFrom}`
  return undefined
}

const problemAt = (x: crypto.X509Certificate, now: number): string | undefined =>
  validityProblem(Date.parse(x.validFrom), Date.parse(x.validTo), now, x)

/**
 * Why Node refused a file, without the JS class: `String(e)` printed `Error: error:0480006C:PEM routines::no start
 * line` to an operator, who reads the prefix as part of the reason.
 */
const reasonOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** Parses a PEM certificate (the first of the file: the leaf) and refuses one not valid at `now` (ms). */
export const parseCert = (
  pem: Buffer,
  file: { readonly key: string; readonly path: string | undefined },
  now: number
) =>
  Effect.try({
    try: () => new crypto.X509Certificate(pem),
    catch: (e) => new TlsError({ key: file.key, ...pathOf(file), reason: `not a PEM certificate: ${reasonOf(e)}` })
  }).pipe(
    Effect.flatMap((x) => {
      const problem = problemAt(x, now)
      return problem === undefined
        ? Effect.succeed(x)
        : Effect.fail(new TlsError({ key: file.key, ...pathOf(file), reason: problem }))
    })
  )

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g

/**
 * Checks a CA bundle: every certificate block in it parses, and at least one is valid at `now` (ms). A bundle
 * during a CA rotation holds the old CA and the new one, and the old one may expire first: that is no reason to
 * refuse the new one (before, only the first block was read, so such a bundle was refused outright, and a broken
 * second block went unnoticed). Text between the blocks (comments, as in system bundles) is allowed.
 */
export const parseCaBundle = (
  pem: Buffer,
  file: { readonly key: string; readonly path: string | undefined },
  now: number
): Effect.Effect<ReadonlyArray<crypto.X509Certificate>, TlsError> =>
  Effect.gen(function* () {
    const fail = (reason: string) => new TlsError({ key: file.key, ...pathOf(file), reason })
    const blocks = pem.toString("latin1").match(PEM_CERTIFICATE) ?? []
    if (blocks.length === 0) return yield* fail("not a PEM certificate: no -----BEGIN CERTIFICATE----- block")
    const certs: Array<crypto.X509Certificate> = []
    for (const [i, block] of blocks.entries()) {
      const cert = yield* Effect.try({
        try: () => new crypto.X509Certificate(block),
        catch: (e) =>
          fail(
            blocks.length === 1
              ? `not a PEM certificate: ${reasonOf(e)}`
              : `certificate ${i + 1} of ${blocks.length} is not a PEM certificate: ${reasonOf(e)}`
          )
      })
      certs.push(cert)
    }
    const problems = certs.map((c) => problemAt(c, now))
    if (problems.some((p) => p === undefined)) return certs
    return yield* fail(
      certs.length === 1
        ? (problems[0] ?? "")
        : `none of the ${certs.length} certificates is valid now: ${problems.map((p, i) => `${i + 1}: ${p}`).join("; ")}`
    )
  })

const pathOf = (file: { readonly path: string | undefined }) => (file.path === undefined ? {} : { path: file.path })

/** Parses a PEM private key; a file that holds none fails naming its key. */
export const parsePrivateKey = (pem: Buffer, file: { readonly key: string; readonly path: string | undefined }) =>
  Effect.try({
    try: () => crypto.createPrivateKey(pem),
    catch: (e) => new TlsError({ key: file.key, ...pathOf(file), reason: `not a PEM private key: ${reasonOf(e)}` })
  })

/**
 * Every problem each file has on its own, for `check`'s one list: a CA bundle, a certificate and a private key,
 * each parsed apart (one not given is skipped). checkKeyPair needs the three together and stops at the first
 * problem, so a bad key beside a bad certificate went unsaid until the certificate was fixed.
 */
export const eachFileProblem = (
  pem: { readonly ca?: Buffer | undefined; readonly cert?: Buffer | undefined; readonly key?: Buffer | undefined },
  files: TlsFiles,
  now: number
): Effect.Effect<ReadonlyArray<TlsError>> =>
  Effect.gen(function* () {
    const found: Array<TlsError> = []
    const keep = (check: Effect.Effect<unknown, TlsError>) =>
      Effect.catch(Effect.asVoid(check), (e: TlsError) => Effect.sync(() => void found.push(e)))
    if (pem.ca !== undefined) yield* keep(parseCaBundle(pem.ca, files.ca, now))
    if (pem.cert !== undefined) yield* keep(parseCert(pem.cert, files.cert, now))
    if (pem.key !== undefined) yield* keep(parsePrivateKey(pem.key, files.key))
    return found
  })

/** What a certificate is used for: served (the gRPC port), or presented as a client (the generate CLI's). */
export type Purpose = "serverAuth" | "clientAuth"

/** RFC 5280 4.2.1.12: id-kp-serverAuth, id-kp-clientAuth, and anyExtendedKeyUsage, which allows every use. */
const PURPOSE_OID: Record<Purpose, string> = { serverAuth: "1.3.6.1.5.5.7.3.1", clientAuth: "1.3.6.1.5.5.7.3.2" }
const ANY_EXTENDED_KEY_USAGE = "2.5.29.37.0"
const OID_NAME: Record<string, string> = { "1.3.6.1.5.5.7.3.1": "serverAuth", "1.3.6.1.5.5.7.3.2": "clientAuth" }

/**
 * Why a certificate whose extended key usages are `usages` (X509Certificate.keyUsage: undefined without the
 * extension, which allows any use) cannot serve `purpose`, or undefined: its peers refuse it in the handshake
 * (OpenSSL's purpose check: INVALID_PURPOSE; Go's crypto/x509 ErrIncompatibleUsage), every one of them. Pure.
 */
export const purposeProblem = (usages: ReadonlyArray<string> | undefined, purpose: Purpose): string | undefined => {
  if (usages === undefined || usages.includes(PURPOSE_OID[purpose]) || usages.includes(ANY_EXTENDED_KEY_USAGE))
    return undefined
  const listed = usages.map((u) => OID_NAME[u] ?? u).join(", ")
  return `its extended key usage (${listed}) lacks ${purpose}, so every peer refuses it; issue it with extendedKeyUsage = ${purpose} (or without the extension)`
}

/**
 * Checks a certificate and its private key, read from `files.cert` and `files.key`: the certificate parses and is
 * valid at `now` (ms), allows `purpose` when given, the key parses and belongs to it (a mismatch names the key file),
 * and Node can make a secure context of them with `ca` (when given). For the server's files, the generate CLI's
 * client pair and etcd's client pair (no purpose: etcd asks for clientAuth only with --client-cert-auth).
 */
export const checkKeyPair = (
  pem: { readonly ca?: Buffer | undefined; readonly cert: Buffer; readonly key: Buffer },
  files: Pick<TlsFiles, "cert" | "key">,
  now: number,
  purpose?: Purpose
): Effect.Effect<void, TlsError> =>
  Effect.gen(function* () {
    const leaf = yield* parseCert(pem.cert, files.cert, now)
    const misused = purpose === undefined ? undefined : purposeProblem(leaf.keyUsage, purpose)
    if (misused !== undefined)
      return yield* new TlsError({ key: files.cert.key, ...pathOf(files.cert), reason: misused })
    const privateKey = yield* parsePrivateKey(pem.key, files.key)
    if (!leaf.checkPrivateKey(privateKey)) {
      return yield* new TlsError({
        key: files.key.key,
        ...pathOf(files.key),
        reason: `does not belong to the certificate in ${files.cert.key}`
      })
    }
    yield* Effect.try({
      try: () => tls.createSecureContext(pem.ca === undefined ? { cert: pem.cert, key: pem.key } : pem),
      catch: (e) => new TlsError({ key: files.cert.key, ...pathOf(files.cert), reason: `unusable: ${reasonOf(e)}` })
    })
  })

/** Reads and checks the three files: parseable PEM, valid now, the certificate fit for `purpose`, the key its own. */
export const readMaterial = (files: TlsFiles, purpose: Purpose): Effect.Effect<TlsMaterial, TlsError> =>
  Effect.gen(function* () {
    // One after another: of several unreadable files the error names the first in this order, every time (read
    // concurrently, whichever read failed first was reported, and `check` printed a different key run to run).
    const [ca, cert, key] = yield* Effect.all([readOne(files.ca), readOne(files.cert), readOne(files.key)])
    const now = yield* Clock.currentTimeMillis
    yield* parseCaBundle(ca, files.ca, now)
    yield* checkKeyPair({ ca, cert, key }, files, now, purpose)
    return { ca, cert, key }
  })

/** True when a re-read found the same bytes (nothing to push to the server). */
export const sameMaterial = (a: TlsMaterial, b: TlsMaterial) =>
  a.ca.equals(b.ca) && a.cert.equals(b.cert) && a.key.equals(b.key)

/** When the served certificate (the leaf, first of the file; checked by readMaterial) stops being valid, ISO 8601. */
export const certificateNotAfter = (material: TlsMaterial): string =>
  new Date(new crypto.X509Certificate(material.cert).validTo).toISOString()
