// mTLS over real loopback connections: the agent's gRPC server (grpc.health.v1 only) with the Tls service's
// material; clients with a good certificate, none, one from another CA, and plaintext. Rotation: the
// served certificate (read from a raw TLS handshake) changes without a restart, on a file write, on a
// Kubernetes-style symlink swap, and on SIGHUP alone. Startup errors name the config key.
import { execFileSync } from "node:child_process"
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as path from "node:path"
import * as tls from "node:tls"
import { Effect, Exit, Layer, Logger, Queue, References, Scope } from "effect"
import { TestClock } from "effect/testing"
import { HealthImplementation } from "grpc-health-check"
import { type Channel, type ChannelCredentials, createChannel, createClient } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { addHealth } from "../../src/layers/grpc/Health.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { clientCredentials, loadClientCredentials } from "../../src/layers/tls/clientCredentials.ts"
import { MaterialCell } from "../../src/layers/tls/materialCell.ts"
import { hangupReload, make, type TlsOptions } from "../../src/layers/tls/Tls.ts"
import {
  eachFileProblem,
  parseCaBundle,
  readMaterial,
  securityFiles,
  validityProblem
} from "../../src/layers/tls/tlsMaterial.ts"
import { watchChanges } from "../../src/layers/tls/watchChanges.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { jitteredBackoffMs } from "../../src/services/retry/Backoff.ts"
import { Tls, TlsError, type TlsService } from "../../src/services/tls/Tls.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { pollUntil } from "../support/poll.ts"

let pki: TestPki
beforeAll(() => {
  pki = makeTestPki()
})
afterAll(() => pki?.cleanup())

const cleanups: Array<() => Promise<void> | void> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

type Security = AgentConfig["security"]

const mtls = (files: { ca: string; cert: string; key: string }): Security => ({
  require_mtls: true,
  ca_file: files.ca,
  cert_file: files.cert,
  key_file: files.key
})

const startTls = async (security: Security, options: TlsOptions = {}): Promise<TlsService> => {
  const scope = Effect.runSync(Scope.make())
  cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  return Effect.runPromise(Scope.provide(make(security, { debounce: "20 millis", ...options }), scope))
}

const startServer = async (service: TlsService): Promise<number> => {
  const server = new Http2GrpcServer({ maxReceiveMessageLength: 1024, tls: service.serverTls })
  const health = new HealthImplementation()
  health.setStatus("", "SERVING")
  addHealth(server, health)
  const port = await server.listen("127.0.0.1", 0)
  cleanups.push(() => server.destroy())
  return port
}

/** One Health.Check on a fresh channel; resolves to "ok" or the gRPC error's code. */
const check = async (port: number, creds: ChannelCredentials): Promise<string> => {
  const channel: Channel = createChannel(`127.0.0.1:${port}`, creds)
  try {
    const client = createClient(HealthDefinition, channel)
    await client.check({ service: "" }, { signal: AbortSignal.timeout(10_000) })
    return "ok"
  } catch (e) {
    return `code ${(e as { code?: number }).code}`
  } finally {
    channel.close()
  }
}

/** The serial number of the certificate a new TLS connection is served. */
const servedSerial = (port: number): Promise<string> =>
  new Promise((resolve, reject) => {
    const socket = tls.connect({
      host: "127.0.0.1",
      port,
      ca: pki.ca.cert,
      cert: pki.client.cert,
      key: pki.client.key,
      ALPNProtocols: ["h2"]
    })
    socket.once("secureConnect", () => {
      const serial = socket.getPeerCertificate().serialNumber
      socket.destroy()
      resolve(serial)
    })
    socket.once("error", reject)
  })

const serialOf = (pem: Buffer): string => new crypto.X509Certificate(pem).serialNumber

/** Polls (bounded) until a new connection is served the certificate with `serial`. */
const awaitServed = async (port: number, serial: string): Promise<void> => {
  await pollUntil(`server presenting serial ${serial}`, async () => (await servedSerial(port)) === serial, 10_000, 20)
}

/** A copy of the server identity in its own directory, so tests can rewrite it. */
const copyIdentity = (name: string) => {
  const dir = fs.mkdtempSync(path.join(pki.dir, `${name}-`))
  const files = { ca: path.join(dir, "ca.crt"), cert: path.join(dir, "tls.crt"), key: path.join(dir, "tls.key") }
  fs.copyFileSync(pki.ca.certFile, files.ca)
  fs.copyFileSync(pki.server.certFile, files.cert)
  fs.copyFileSync(pki.server.keyFile, files.key)
  return { dir, files }
}

/** Atomic replace (write a temp file, rename over), as editors and cert managers do. */
const replaceFile = (target: string, content: Buffer) => {
  fs.writeFileSync(`${target}.tmp`, content)
  fs.renameSync(`${target}.tmp`, target)
}

describe("mTLS server credentials", () => {
  it("accepts a client certificate from the CA; refuses none, another CA's, and plaintext", async () => {
    const service = await startTls(mtls({ ca: pki.ca.certFile, cert: pki.server.certFile, key: pki.server.keyFile }))
    expect(service.enabled).toBe(true)
    const port = await startServer(service)
    const good = clientCredentials({ ca: pki.ca.cert, cert: pki.client.cert, key: pki.client.key })
    expect(await check(port, good)).toBe("ok")
    expect(await check(port, clientCredentials({ ca: pki.ca.cert }))).toBe("code 14")
    const foreign = clientCredentials({ ca: pki.ca.cert, cert: pki.otherClient.cert, key: pki.otherClient.key })
    expect(await check(port, foreign)).toBe("code 14")
    expect(await check(port, clientCredentials())).toBe("code 14")
    // A client trusting only the other CA refuses the server, too.
    expect(
      await check(port, clientCredentials({ ca: pki.otherCa.cert, cert: pki.client.cert, key: pki.client.key }))
    ).toBe("code 14")
  })

  it("plaintext when require_mtls is false", async () => {
    const service = await startTls({ require_mtls: false })
    expect(service.enabled).toBe(false)
    expect(await Effect.runPromise(service.status)).toEqual({ enabled: false, generation: 0 })
    const port = await startServer(service)
    expect(await check(port, clientCredentials())).toBe("ok")
  })

  it("a rewritten certificate is served to new connections without a restart", async () => {
    const { files } = copyIdentity("rewrite")
    const service = await startTls(mtls(files))
    const port = await startServer(service)
    await awaitServed(port, serialOf(pki.server.cert))
    const next = pki.issueServer("rotated")
    replaceFile(files.key, next.key)
    replaceFile(files.cert, next.cert)
    await awaitServed(port, serialOf(next.cert))
    expect(await Effect.runPromise(service.generation)).toBeGreaterThanOrEqual(2)
    const good = clientCredentials({ ca: pki.ca.cert, cert: pki.client.cert, key: pki.client.key })
    expect(await check(port, good)).toBe("ok")
    expect(await check(port, clientCredentials({ ca: pki.ca.cert }))).toBe("code 14")
  })

  it("a Kubernetes secret update (..data symlink swap) is seen", async () => {
    // Layout of a secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/
    const mount = fs.mkdtempSync(path.join(pki.dir, "k8s-"))
    const writeVersion = (name: string, cert: Buffer, key: Buffer) => {
      const v = path.join(mount, `..${name}`)
      fs.mkdirSync(v)
      fs.writeFileSync(path.join(v, "ca.crt"), pki.ca.cert)
      fs.writeFileSync(path.join(v, "tls.crt"), cert)
      fs.writeFileSync(path.join(v, "tls.key"), key)
      fs.symlinkSync(`..${name}`, path.join(mount, "..data_tmp"))
      fs.renameSync(path.join(mount, "..data_tmp"), path.join(mount, "..data"))
    }
    writeVersion("v1", pki.server.cert, pki.server.key)
    for (const f of ["ca.crt", "tls.crt", "tls.key"]) fs.symlinkSync(`..data/${f}`, path.join(mount, f))
    const files = {
      ca: path.join(mount, "ca.crt"),
      cert: path.join(mount, "tls.crt"),
      key: path.join(mount, "tls.key")
    }
    const service = await startTls(mtls(files))
    const port = await startServer(service)
    await awaitServed(port, serialOf(pki.server.cert))
    const next = pki.issueServer("k8s-rotated")
    writeVersion("v2", next.cert, next.key)
    await awaitServed(port, serialOf(next.cert))
  })

  it("each reload compares with the material served now: unchanged files after a rotation are no change, and the first certificate put back is one", async () => {
    const { files } = copyIdentity("compare-current")
    const service = await startTls(mtls(files), { watch: false, sighup: false, recheck: "1 hour" })
    const port = await startServer(service)
    const next = pki.issueServer("compare-rotated")
    replaceFile(files.key, next.key)
    replaceFile(files.cert, next.cert)
    expect(await Effect.runPromise(service.reload)).toBe(true)
    // what a server started now would listen with (GrpcServer reads current())
    expect(service.serverTls?.current().cert.equals(next.cert)).toBe(true)
    // a SIGHUP or re-read with the files unchanged since: nothing to apply
    expect(await Effect.runPromise(service.reload)).toBe(false)
    expect(await Effect.runPromise(service.generation)).toBe(2)
    // the first pair put back (a rotation rolled back): applied
    replaceFile(files.key, pki.server.key)
    replaceFile(files.cert, pki.server.cert)
    expect(await Effect.runPromise(service.reload)).toBe(true)
    expect(await Effect.runPromise(service.generation)).toBe(3)
    expect(await servedSerial(port)).toBe(serialOf(pki.server.cert))
  })

  it("a certificate symlinked into a directory no watch covers is seen at each rotation, not only the first (its file watch re-armed)", async () => {
    // tls.crt and tls.key are symlinks into another directory: a file watch follows the link to the file, and the
    // watched directory (the links') never changes. No periodic re-read within the test.
    const { dir: mount, files } = copyIdentity("linked")
    const store = fs.mkdtempSync(path.join(pki.dir, "linked-store-"))
    for (const name of ["tls.crt", "tls.key"]) {
      fs.renameSync(path.join(mount, name), path.join(store, name))
      fs.symlinkSync(path.join(store, name), path.join(mount, name))
    }
    const service = await startTls(mtls(files), { sighup: false, recheck: "1 hour" })
    const port = await startServer(service)
    for (const round of [1, 2]) {
      const next = pki.issueServer(`linked-${round}`)
      replaceFile(path.join(store, "tls.key"), next.key)
      replaceFile(path.join(store, "tls.crt"), next.cert)
      await awaitServed(port, serialOf(next.cert))
    }
  })

  it("the SIGHUP listener goes with the scope (a layer built again must not add one each time)", async () => {
    const before = process.listenerCount("SIGHUP")
    const { files } = copyIdentity("hup-listener")
    await Effect.runPromise(
      Effect.scoped(
        Effect.flatMap(Queue.sliding<void>(1), (q) =>
          Effect.andThen(
            watchChanges([files.cert], { watch: false }, q),
            Effect.sync(() => expect(process.listenerCount("SIGHUP")).toBe(before + 1))
          )
        )
      )
    )
    expect(process.listenerCount("SIGHUP")).toBe(before)
  })

  it("the material cell: a listener that unsubscribed (a closed server) gets no later material", () => {
    const first = { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
    const cell = new MaterialCell(first)
    const seen: Array<string> = []
    const stop = cell.subscribe(() => seen.push("closed"))
    cell.subscribe(() => seen.push("open"))
    stop()
    const next = { ...first, cert: Buffer.from("next") }
    cell.update(next)
    expect(seen).toEqual(["open"])
    expect(cell.current()).toBe(next)
  })

  it("SIGHUP alone re-reads the files", async () => {
    const { files } = copyIdentity("sighup")
    const service = await startTls(mtls(files), { watch: false })
    const port = await startServer(service)
    const next = pki.issueServer("hup-rotated")
    replaceFile(files.key, next.key)
    replaceFile(files.cert, next.cert)
    expect(await servedSerial(port)).toBe(serialOf(pki.server.cert))
    process.kill(process.pid, "SIGHUP")
    await awaitServed(port, serialOf(next.cert))
  })

  it("a rotation no watch saw (inotify's limit reached, NFS) is picked up by the periodic re-read", async () => {
    const { files } = copyIdentity("recheck")
    const service = await startTls(mtls(files), { watch: false, sighup: false, recheck: "50 millis" })
    const port = await startServer(service)
    const next = pki.issueServer("recheck-rotated")
    replaceFile(files.key, next.key)
    replaceFile(files.cert, next.cert)
    await awaitServed(port, serialOf(next.cert))
    expect(await Effect.runPromise(service.generation)).toBe(2)
  })

  it("watchChanges reports a directory it cannot watch, with why (so the caller can say it re-reads instead)", async () => {
    const { files } = copyIdentity("unwatchable")
    // fs.watch throws for a missing directory as it throws ENOSPC when inotify's watch limit is reached
    const missing = path.join(pki.dir, "no-such-dir", "tls.crt")
    const unwatched = await Effect.runPromise(
      Effect.scoped(
        Effect.flatMap(Queue.sliding<void>(1), (q) => watchChanges([files.cert, missing], { sighup: false }, q))
      )
    )
    expect(unwatched).toEqual([{ path: path.dirname(missing), reason: expect.stringContaining("ENOENT") }])
  })

  // The daemon's SIGHUP route (programs/runMain.ts reloadOnHangup) runs hangupReload: it reloads in place and
  // never fails, also when the new files are bad.
  it("hangupReload (the daemon's SIGHUP) serves the new certificate and survives a bad file", async () => {
    const { files } = copyIdentity("hangup-reload")
    const service = await startTls(mtls(files), { watch: false, sighup: false })
    const port = await startServer(service)
    const next = pki.issueServer("hangup-rotated")
    replaceFile(files.key, next.key)
    replaceFile(files.cert, next.cert)
    const reload = Effect.provideService(hangupReload, Tls, service)
    await Effect.runPromise(reload)
    expect(await servedSerial(port)).toBe(serialOf(next.cert))
    fs.writeFileSync(files.cert, "not a certificate")
    expect(Exit.isSuccess(await Effect.runPromiseExit(reload))).toBe(true)
    expect(await servedSerial(port)).toBe(serialOf(next.cert))
    expect(await Effect.runPromise(service.generation)).toBe(2)
  })

  it("a broken certificate is warned about once, however often its directory changes after", async () => {
    const { dir, files } = copyIdentity("storm")
    const lines: Array<string> = []
    const logging = Layer.mergeAll(
      Logger.layer([Logger.make(({ logLevel, message }) => lines.push(`${logLevel} ${[message].flat().join(" ")}`))]),
      Layer.succeed(References.MinimumLogLevel, "Debug")
    )
    const scope = Effect.runSync(Scope.make())
    cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
    await Effect.runPromise(
      Scope.provide(make(mtls(files), { debounce: "20 millis", sighup: false }), scope).pipe(Effect.provide(logging))
    )
    const about = (level: string) => lines.filter((l) => l.startsWith(level) && l.includes("keeping the previous"))
    fs.writeFileSync(files.cert, "not a certificate")
    await pollUntil("the first warning", () => about("Warn").length === 1, 10_000, 10)
    // A log file kept next to the certificates: each line written is a change, and each change a reload.
    for (let i = 1; i <= 3; i++) {
      fs.appendFileSync(path.join(dir, "agent.log"), `line ${i}\n`)
      await pollUntil(`reload ${i} after the warning`, () => about("Debug").length >= i, 10_000, 10)
    }
    expect(about("Warn").length).toBe(1)
    // The files served put back: said, so the log does not end on the warning.
    fs.copyFileSync(pki.server.certFile, files.cert)
    await pollUntil(
      "the recovery said",
      () => lines.some((l) => l.startsWith("Info") && l.includes("certificate files are valid again")),
      10_000,
      10
    )
    // Broken another way: a new problem is warned about again.
    fs.copyFileSync(pki.client.keyFile, files.key)
    await pollUntil("the new problem's warning", () => about("Warn").length === 2, 10_000, 10)
  })

  it("an invalid new file is refused and the old certificate kept", async () => {
    const { files } = copyIdentity("invalid")
    const service = await startTls(mtls(files), { watch: false, sighup: false })
    const port = await startServer(service)
    fs.writeFileSync(files.cert, "not a certificate")
    const error = await Effect.runPromise(Effect.flip(service.reload))
    expect(error.message).toContain("security.cert_file")
    expect((await Effect.runPromise(service.lastError))?.key).toBe("security.cert_file")
    expect(await servedSerial(port)).toBe(serialOf(pki.server.cert))
    // A key from another certificate is refused as well.
    fs.copyFileSync(pki.server.certFile, files.cert)
    fs.copyFileSync(pki.client.keyFile, files.key)
    const mismatch = await Effect.runPromise(Effect.flip(service.reload))
    expect(mismatch.key).toBe("security.key_file")
    expect(await Effect.runPromise(service.generation)).toBe(1)
  })
})

describe("startup errors name the key", () => {
  const startError = (security: Security) => Effect.runPromise(Effect.flip(Effect.scoped(make(security))))

  const file = (name: string | undefined) => (name === undefined ? undefined : path.join(pki.dir, name))
  it.each([
    ["missing ca_file", [undefined, "server.crt", "server.key"], "security.ca_file", "required"],
    ["missing cert file", ["ca.crt", "nope.crt", "server.key"], "security.cert_file", "cannot read"],
    ["garbage ca", ["server.key", "server.crt", "server.key"], "security.ca_file", "not a PEM"],
    ["key of another cert", ["ca.crt", "server.crt", "client.key"], "security.key_file", "does not belong"]
  ] as const)("%s", async (_name, [ca, cert, key], expectedKey, reason) => {
    const [caFile, certFile, keyFile] = [file(ca), file(cert), file(key)]
    const security: Security = {
      require_mtls: true,
      ...(caFile === undefined ? {} : { ca_file: caFile }),
      ...(certFile === undefined ? {} : { cert_file: certFile }),
      ...(keyFile === undefined ? {} : { key_file: keyFile })
    }
    const error = await startError(security)
    expect(error).toBeInstanceOf(TlsError)
    expect(error.key).toBe(expectedKey)
    expect(error.message).toContain(expectedKey)
    expect(error.reason).toContain(reason)
  })

  it('an empty path is no file: required, as a missing one (not a read of "")', async () => {
    const error = await startError({
      ...mtls({ ca: pki.ca.certFile, cert: pki.server.certFile, key: pki.server.keyFile }),
      ca_file: ""
    })
    expect(error.key).toBe("security.ca_file")
    expect(error.reason).toBe("required when security.require_mtls = true")
  })

  it("check's report: each file's own problem, a bad private key beside good certificates included", async () => {
    const files = securityFiles(mtls({ ca: pki.ca.certFile, cert: pki.server.certFile, key: pki.server.keyFile }))
    const pem = { ca: pki.ca.cert, cert: pki.server.cert, key: Buffer.from("not a key") }
    const problems = await Effect.runPromise(eachFileProblem(pem, files, Date.now()))
    expect(problems.map((p) => [p.key, p.reason.split(":")[0]])).toEqual([
      ["security.key_file", "not a PEM private key"]
    ])
  })
})

describe("client credentials from files", () => {
  it("loads ca/cert/key and connects; names the flag on errors", async () => {
    const service = await startTls(mtls({ ca: pki.ca.certFile, cert: pki.server.certFile, key: pki.server.keyFile }))
    const port = await startServer(service)
    const creds = await Effect.runPromise(
      loadClientCredentials({ caFile: pki.ca.certFile, certFile: pki.client.certFile, keyFile: pki.client.keyFile })
    )
    expect(await check(port, creds)).toBe("ok")
    const half = await Effect.runPromise(Effect.flip(loadClientCredentials({ caFile: pki.ca.certFile, certFile: "x" })))
    expect(half.message).toContain("--tls-key")
    const missing = await Effect.runPromise(Effect.flip(loadClientCredentials({ caFile: "/nonexistent/ca.pem" })))
    expect(missing.message).toContain("--tls-ca (/nonexistent/ca.pem)")
    // --tls-ca alone is checked for certificates too: Node would skip a bundle with none and trust nothing said
    const noCa = await Effect.runPromise(Effect.flip(loadClientCredentials({ caFile: pki.client.keyFile })))
    expect(noCa.message).toContain(`--tls-ca (${pki.client.keyFile})`)
  })
})

describe("rotation caught half-way", () => {
  it("a new certificate with the old key is refused, the old pair kept, and retried until the key arrives", async () => {
    // No watches and no SIGHUP: only the retry after the failed reload can pick up the key written later.
    const { files } = copyIdentity("half-written")
    const service = await startTls(mtls(files), { watch: false, sighup: false, retryInitial: "20 millis" })
    const port = await startServer(service)
    const next = pki.issueServer("half-rotated")
    replaceFile(files.cert, next.cert)
    const error = await Effect.runPromise(Effect.flip(service.reload))
    expect(error.key).toBe("security.key_file")
    expect(error.reason).toContain("does not belong")
    expect((await Effect.runPromise(service.lastError))?.key).toBe("security.key_file")
    expect(await servedSerial(port)).toBe(serialOf(pki.server.cert))
    const notAfterOf = (pem: Buffer) => new Date(new crypto.X509Certificate(pem).validTo).toISOString()
    // What /status and the metrics show meanwhile: the old certificate, and why the new one is not served.
    const failing = await Effect.runPromise(service.status)
    expect(failing).toMatchObject({ enabled: true, generation: 1, certificateNotAfter: notAfterOf(pki.server.cert) })
    expect(failing.reloadError).toMatch(/^security\.key_file .*does not belong/)
    replaceFile(files.key, next.key)
    await awaitServed(port, serialOf(next.cert))
    expect(await Effect.runPromise(service.lastError)).toBeUndefined()
    expect(await Effect.runPromise(service.generation)).toBe(2)
    expect(await Effect.runPromise(service.status)).toEqual({
      enabled: true,
      generation: 2,
      certificateNotAfter: notAfterOf(next.cert)
    })
  })

  it("retries back off: the shared backoff from the TLS base (1 s) doubling up to the cap, jittered down to half", () => {
    expect([1, 2, 3, 4, 8, 60].map((n) => jitteredBackoffMs(n, 60_000, 1, 1000))).toEqual([
      1000, 2000, 4000, 8000, 60_000, 60_000
    ])
    expect(jitteredBackoffMs(3, 60_000, 0, 1000)).toBe(2000)
  })
})

/** Runs `effect` with the clock at `at` (ms since the epoch). */
const atTime = <A, E>(at: number, effect: Effect.Effect<A, E>) =>
  Effect.runPromise(
    Effect.flip(TestClock.setTime(at).pipe(Effect.andThen(effect), Effect.provide(TestClock.layer())))
  ) as Promise<E>

const openssl = (args: ReadonlyArray<string>, cwd: string) =>
  execFileSync("/usr/bin/openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] })

/** A CA and a server certificate it signs, both valid for `days`, in a directory of their own. */
const longLived = (name: string, days: number) => {
  const dir = fs.mkdtempSync(path.join(pki.dir, `${name}-`))
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
  openssl(
    ["req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", `${days}`, "-subj", `/CN=${name}`].concat([
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign"
    ]),
    dir
  )
  fs.writeFileSync(path.join(dir, "server.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
  openssl(["req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server"], dir)
  openssl(
    [
      "x509",
      "-req",
      "-in",
      "server.csr",
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-set_serial",
      "7",
      "-days",
      `${days}`
    ].concat(["-out", "server.crt", "-extfile", "server.ext"]),
    dir
  )
  return {
    ca: fs.readFileSync(path.join(dir, "ca.crt")),
    cert: path.join(dir, "server.crt"),
    key: path.join(dir, "server.key"),
    dir
  }
}

describe("certificate validity", () => {
  const server = () => new crypto.X509Certificate(pki.server.cert)
  const files = () => securityFiles(mtls({ ca: pki.ca.certFile, cert: pki.server.certFile, key: pki.server.keyFile }))

  it("refuses a certificate not yet valid, naming the key", async () => {
    const error = await atTime(Date.parse(server().validFrom) - 3_600_000, readMaterial(files(), "serverAuth"))
    expect(error.key).toBe("security.ca_file")
    expect(error.reason).toContain("not valid before")
  })

  it("refuses an expired certificate", async () => {
    const error = await atTime(Date.parse(server().validTo) + 1000, readMaterial(files(), "serverAuth"))
    expect(error.key).toBe("security.ca_file")
    expect(error.reason).toMatch(/^certificate expired on /)
  })

  it("the validity window (pure)", () => {
    const text = { validFrom: "from", validTo: "to" }
    expect(validityProblem(100, 200, 150, text)).toBeUndefined()
    expect(validityProblem(100, 200, 100, text)).toBeUndefined()
    expect(validityProblem(100, 200, 99, text)).toBe("certificate not valid before from")
    expect(validityProblem(100, 200, 200, text)).toBe("certificate expired on to")
    expect(validityProblem(100, 200, Number.NaN, text)).toBe("certificate expired on to")
  })

  it("a not-yet-valid certificate written while serving is refused and the old one kept", async () => {
    const { files: copy } = copyIdentity("future-rotation")
    const service = await startTls(mtls(copy), { watch: false, sighup: false, retryInitial: "1 hour" })
    const port = await startServer(service)
    // a pair from another, longer-lived CA: valid now, so the service's own check is on the clock alone
    const later = longLived("later-ca", 3)
    fs.writeFileSync(copy.ca, Buffer.concat([pki.ca.cert, later.ca]))
    replaceFile(copy.key, fs.readFileSync(later.key))
    replaceFile(copy.cert, fs.readFileSync(later.cert))
    const laterCert = new crypto.X509Certificate(fs.readFileSync(later.cert))
    const error = await atTime(Date.parse(laterCert.validFrom) - 60_000, service.reload)
    expect(error.reason).toContain("not valid before")
    expect(await servedSerial(port)).toBe(serialOf(pki.server.cert))
  })
})

describe("CA bundles", () => {
  const garbage = Buffer.from("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
  const where = { key: "security.ca_file", path: "/etc/ca.pem" }

  it("accepts a bundle whose first CA expired while another is valid (a CA rotation's overlap)", async () => {
    // pki.ca lives 1 day; `longer` 3 days. At +36 h only `longer` (and the server it signed) is valid.
    const longer = longLived("longer-ca", 3)
    const bundle = path.join(longer.dir, "bundle.crt")
    fs.writeFileSync(bundle, Buffer.concat([pki.ca.cert, Buffer.from("# comment between blocks\n"), longer.ca]))
    const at = Date.now() + 36 * 3_600_000
    const files = securityFiles(mtls({ ca: bundle, cert: longer.cert, key: longer.key }))
    const material = await Effect.runPromise(
      TestClock.setTime(at).pipe(Effect.andThen(readMaterial(files, "serverAuth")), Effect.provide(TestClock.layer()))
    )
    expect(material.ca.equals(fs.readFileSync(bundle))).toBe(true)
    // every CA of the bundle expired: refused, each one's reason given
    const expired = await atTime(at, parseCaBundle(Buffer.concat([pki.ca.cert, pki.otherCa.cert]), where, at))
    expect(expired.reason).toMatch(/^none of the 2 certificates is valid now: 1: certificate expired on .*; 2: /)
  })

  it("refuses a bundle with a broken certificate after a good one", async () => {
    const error = await Effect.runPromise(
      Effect.flip(parseCaBundle(Buffer.concat([pki.ca.cert, garbage]), where, Date.now()))
    )
    expect(error.message).toMatch(/^security\.ca_file \(\/etc\/ca\.pem\): certificate 2 of 2 is not a PEM certificate/)
    const none = await Effect.runPromise(Effect.flip(parseCaBundle(Buffer.from("hello"), where, Date.now())))
    expect(none.reason).toContain("not a PEM certificate")
  })

  it("a bundle of two CAs: clients of either are accepted", async () => {
    const { files } = copyIdentity("bundle")
    fs.writeFileSync(files.ca, Buffer.concat([pki.otherCa.cert, pki.ca.cert]))
    const service = await startTls(mtls(files))
    const port = await startServer(service)
    const mine = clientCredentials({ ca: pki.ca.cert, cert: pki.client.cert, key: pki.client.key })
    const other = clientCredentials({ ca: pki.ca.cert, cert: pki.otherClient.cert, key: pki.otherClient.key })
    expect(await check(port, mine)).toBe("ok")
    expect(await check(port, other)).toBe("ok")
  })
})
