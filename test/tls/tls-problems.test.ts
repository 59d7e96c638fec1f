// What an operator reads of bad certificate files (operator review, session 39): a garbage certificate beside a
// missing key is listed with it, not once the key is fixed; Node's refusal without the JS `Error: ` prefix (check,
// start, SIGHUP); and on SIGHUP one warning for the one cause, where three said it (the SIGHUP's, the retry's and the
// config file's "would be refused at the next start"), the metric's and /status' reloadError unchanged.
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Exit, Layer, Logger, References, Result, Scope } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { hangupReload, make } from "../../src/layers/tls/Tls.ts"
import { purposeProblem, readMaterial, securityFiles } from "../../src/layers/tls/tlsMaterial.ts"
import { preflight } from "../../src/programs/check.ts"
import { hangupConfig } from "../../src/programs/hangup.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { LogLevel } from "../../src/services/observability/LogLevel.ts"
import { Tls, type TlsService } from "../../src/services/tls/Tls.ts"
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

/** A config file in its own temp dir: [security] with the files named, a state_dir of its own (0700). */
const configWith = (security: { ca: string; cert: string; key: string }) => {
  const dir = fs.mkdtempSync(path.join(pki.dir, "cfg-"))
  const state = path.join(dir, "state")
  fs.mkdirSync(state, { mode: 0o700 })
  const file = path.join(dir, "agent.toml")
  const text = [
    "[security]",
    "require_mtls = true",
    `ca_file = "${security.ca}"`,
    `cert_file = "${security.cert}"`,
    `key_file = "${security.key}"`,
    "[agent]",
    `state_dir = "${state}"`,
    '[models.m]\nhf_repo = "a/b"\n'
  ].join("\n")
  fs.writeFileSync(file, text)
  const r = decodeConfig(text, file, {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return { dir, file, config: r.success }
}

/** ca, certificate and key copied to a temp dir of their own (the test breaks them there). */
const copyIdentity = () => {
  const dir = fs.mkdtempSync(path.join(pki.dir, "id-"))
  const files = { ca: path.join(dir, "ca.crt"), cert: path.join(dir, "tls.crt"), key: path.join(dir, "tls.key") }
  fs.copyFileSync(pki.ca.certFile, files.ca)
  fs.copyFileSync(pki.server.certFile, files.cert)
  fs.copyFileSync(pki.server.keyFile, files.key)
  return files
}

const problemsOf = async (c: AgentConfig): Promise<ReadonlyArray<string>> => {
  const exit = await Effect.runPromiseExit(preflight(c))
  if (Exit.isSuccess(exit)) return []
  const e = exit.cause.reasons.find((r) => r._tag === "Fail")?.error
  return (e as { problems: ReadonlyArray<string> }).problems
}

describe("bad certificate files, as check (and run) list them", () => {
  it("a garbage certificate is listed beside a missing key, without Node's `Error: ` prefix", async () => {
    const files = copyIdentity()
    fs.writeFileSync(files.cert, "garbage\n")
    const missing = path.join(path.dirname(files.key), "missing.key")
    const { config } = configWith({ ...files, key: missing })
    const problems = await problemsOf(config)
    expect(problems).toHaveLength(2)
    expect(problems[0]).toMatch(/^security\.key_file \(.*missing\.key\): cannot read: ENOENT/)
    expect(problems[1]).toMatch(
      new RegExp(`^security\\.cert_file \\(${files.cert.replace(/[.]/g, "\\.")}\\): not a PEM certificate: \\S`)
    )
    for (const p of problems) expect(p).not.toContain("Error: ")
  })

  it("the key pair is checked once both parse: a key of another certificate, alone", async () => {
    const files = copyIdentity()
    fs.copyFileSync(pki.client.keyFile, files.key)
    const { config } = configWith(files)
    expect(await problemsOf(config)).toEqual([
      `security.key_file (${files.key}): does not belong to the certificate in security.cert_file`
    ])
  })

  it("a garbage key beside a garbage certificate: both, each without the prefix", async () => {
    const files = copyIdentity()
    fs.writeFileSync(files.cert, "garbage\n")
    fs.writeFileSync(files.key, "garbage\n")
    const problems = await problemsOf(configWith(files).config)
    expect(problems.map((p) => p.split(":")[0])).toEqual([
      `security.cert_file (${files.cert})`,
      `security.key_file (${files.key})`
    ])
    expect(problems[1]).toMatch(/: not a PEM private key: \S/)
    for (const p of problems) expect(p).not.toContain("Error: ")
  })

  it("at start (readMaterial) the same reason, without the prefix", async () => {
    const files = copyIdentity()
    fs.writeFileSync(files.cert, "garbage\n")
    const security = { require_mtls: true, ca_file: files.ca, cert_file: files.cert, key_file: files.key }
    const e = await Effect.runPromise(Effect.flip(readMaterial(securityFiles(security), "serverAuth")))
    expect(e.message).toMatch(/^security\.cert_file \(.*\): not a PEM certificate: \S/)
    expect(e.message).not.toContain("Error: ")
  })
})

describe("a certificate whose extended key usage does not allow its use", () => {
  it("purposeProblem: without the extension, with the purpose or anyExtendedKeyUsage, fine; else named", () => {
    expect(purposeProblem(undefined, "serverAuth")).toBeUndefined()
    expect(purposeProblem(["1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"], "serverAuth")).toBeUndefined()
    expect(purposeProblem(["2.5.29.37.0"], "clientAuth")).toBeUndefined()
    expect(purposeProblem(["1.3.6.1.5.5.7.3.2"], "serverAuth")).toBe(
      "its extended key usage (clientAuth) lacks serverAuth, so every peer refuses it; issue it with extendedKeyUsage = serverAuth (or without the extension)"
    )
    expect(purposeProblem(["1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.4"], "clientAuth")).toMatch(
      /^its extended key usage \(serverAuth, 1\.3\.6\.1\.5\.5\.7\.3\.4\) lacks clientAuth/
    )
  })

  it("a client certificate as the server's: check lists it, and the start refuses it (routers would all refuse it)", async () => {
    const files = copyIdentity()
    fs.copyFileSync(pki.client.certFile, files.cert)
    fs.copyFileSync(pki.client.keyFile, files.key)
    expect(await problemsOf(configWith(files).config)).toEqual([
      `security.cert_file (${files.cert}): its extended key usage (clientAuth) lacks serverAuth, so every peer refuses it; issue it with extendedKeyUsage = serverAuth (or without the extension)`
    ])
    const security = { require_mtls: true, ca_file: files.ca, cert_file: files.cert, key_file: files.key }
    const e = await Effect.runPromise(Effect.flip(readMaterial(securityFiles(security), "serverAuth")))
    expect(e.message).toMatch(/^security\.cert_file \(.*\): its extended key usage \(clientAuth\) lacks serverAuth/)
  })
})

describe("SIGHUP with a garbage certificate: one cause, one warning", () => {
  /** A live Tls of `files` (no watch: the test says when the files change), its log lines kept as `Level message`. */
  const start = async (files: { ca: string; cert: string; key: string }) => {
    const lines: Array<string> = []
    const logging = Layer.mergeAll(
      Logger.layer([
        Logger.make(({ logLevel, message }) =>
          lines.push(
            `${logLevel} ${[message]
              .flat()
              .map((m) => (typeof m === "string" ? m : JSON.stringify(m)))
              .join(" ")}`
          )
        )
      ]),
      Layer.succeed(References.MinimumLogLevel, "Debug")
    )
    const scope = Effect.runSync(Scope.make())
    cleanups.push(() => Effect.runPromise(Scope.close(scope, Exit.void)))
    const security = { require_mtls: true, ca_file: files.ca, cert_file: files.cert, key_file: files.key }
    const service: TlsService = await Effect.runPromise(
      Scope.provide(make(security, { watch: false, sighup: false, retryInitial: "10 millis" }), scope).pipe(
        Effect.provide(logging)
      )
    )
    // the daemon's log threshold, which a SIGHUP that applies the file would move (none here: each file is refused)
    const threshold = LogLevel.of({
      current: Effect.succeed("Info"),
      configure: () => Effect.die("a refused config file applied its log level")
    })
    const run = <A, E>(effect: Effect.Effect<A, E, Tls | LogLevel>) =>
      Effect.runPromise(
        effect.pipe(
          Effect.provideService(Tls, service),
          Effect.provideService(LogLevel, threshold),
          Effect.provide(logging)
        )
      )
    const about = (level: string, text: string) => lines.filter((l) => l.startsWith(level) && l.includes(text))
    return { service, lines, run, about }
  }

  it("the SIGHUP's warning is the only one: the retries it starts say it at debug, the config file's line at info", async () => {
    const files = copyIdentity()
    const { file, config } = configWith(files)
    const { service, lines, run, about } = await start(files)
    fs.writeFileSync(files.cert, "garbage\n")
    // the daemon's SIGHUP (main.ts): the certificates, then the config file
    await run(
      Effect.flatMap(hangupReload, (said) => hangupConfig({ ...config, file }, said === undefined ? [] : [said]))
    )
    // the retry the failed reload started has run (and found the same problem)
    await pollUntil("a retry", () => about("Debug", "tls: keeping the previous certificates").length > 0, 10_000, 10)
    const warnings = lines.filter((l) => l.startsWith("Warn"))
    expect(warnings).toHaveLength(1)
    expect(warnings[0]).toMatch(
      /^Warn SIGHUP: keeping the previous certificates: security\.cert_file \(.*\): not a PEM certificate: \S/
    )
    expect(warnings[0]).not.toContain("Error: ")
    expect(about("Info", "SIGHUP: the config file would be refused at the next start")).toEqual([
      "Info SIGHUP: the config file would be refused at the next start for the TLS files' problem said above; nothing in it applied, log level kept"
    ])
    // what /status and the metric read is as it was
    const status = await Effect.runPromise(service.status)
    expect(status.reloadError).toMatch(/^security\.cert_file \(.*\): not a PEM certificate: /)
  })

  it("a problem a file event warned of first: the SIGHUP answers at info, pointing at /status", async () => {
    const files = copyIdentity()
    const { service, lines, run, about } = await start(files)
    fs.writeFileSync(files.cert, "garbage\n")
    // a reload not from SIGHUP (a file event's), which warns; then its retries, at debug
    await Effect.runPromise(Effect.ignore(service.reload))
    await pollUntil("the file event's warning", () => about("Warn", "tls: keeping the previous").length === 1)
    await run(hangupReload)
    expect(lines.filter((l) => l.startsWith("Warn"))).toHaveLength(1)
    expect(about("Info", "SIGHUP: keeping the previous certificates")).toEqual([
      "Info SIGHUP: keeping the previous certificates: the files still have the problem warned of (/status tls.reloadError)"
    ])
    // a new problem is warned of again, and files fixed by a SIGHUP make the next problem new too
    fs.writeFileSync(files.key, "garbage\n")
    fs.copyFileSync(pki.server.certFile, files.cert)
    await run(hangupReload)
    expect(about("Warn", "SIGHUP: keeping the previous certificates: security.key_file")).toHaveLength(1)
    fs.copyFileSync(pki.server.keyFile, files.key)
    await run(hangupReload)
    expect(about("Info", "SIGHUP: certificates unchanged")).toHaveLength(1)
    fs.writeFileSync(files.cert, "garbage\n")
    await run(hangupReload)
    expect(about("Warn", "SIGHUP: keeping the previous certificates: security.cert_file")).toHaveLength(1)
  })

  it("a config file refused for more than the certificates names only the rest", async () => {
    const files = copyIdentity()
    const { file, config } = configWith(files)
    const { run, lines } = await start(files)
    fs.writeFileSync(files.cert, "garbage\n")
    // the new file also opens the admin port to the network without a token
    const text = fs.readFileSync(file, "utf8").replace("[agent]\n", '[agent]\nlisten_admin = "0.0.0.0:9091"\n')
    fs.writeFileSync(file, text)
    await run(
      Effect.flatMap(hangupReload, (said) => hangupConfig({ ...config, file }, said === undefined ? [] : [said]))
    )
    const refused = lines.filter((l) => l.includes("would be refused at the next start"))
    expect(refused).toHaveLength(1)
    expect(refused[0]).toMatch(/^Warn .*"problems":\["agent\.listen_admin/)
    // the certificate's problem is the SIGHUP's warning alone
    expect(refused[0]).not.toContain("security.cert_file")
    expect(lines.filter((l) => l.includes("security.cert_file") && l.startsWith("Warn"))).toHaveLength(1)
  })
})
