/**
 * HealthReporter over TLS against a real etcd (test/support/etcd.ts with `tls`, certificates from
 * test/support/certs.ts): registration with a client certificate, etcd refusing an agent without one or
 * with the wrong CA (retrying with a clear error, never a crash), and an unreadable TLS file failing the
 * layer at start with EtcdTlsError naming the [cluster] key.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Cause, Effect, Exit, Layer, ManagedRuntime } from "effect"
import { Etcd3 } from "etcd3"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { NodeHealth } from "../../src/gen/cgn/agent/v1/agent.ts"
import { decodeConfigObject, layerFromObject } from "../../src/layers/config/Config.ts"
import { layer as healthReporterLayer } from "../../src/layers/registry/HealthReporter.ts"
import { preflight } from "../../src/programs/check.ts"
import { HealthReporter, nodeKey, type RegistrationStatus } from "../../src/services/registry/HealthReporter.ts"
import { layerTest as nodeStatusTest } from "../../src/testing/NodeStatus.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { type EtcdHandle, pollUntil, startEtcd, startMtlsEtcd } from "../support/etcd.ts"

let unhandled = 0
const onUnhandled = () => {
  unhandled++
}
process.on("unhandledRejection", onUnhandled)

let pki: TestPki
let etcd: EtcdHandle
let admin: Etcd3
let counter = 0
const cleanups: Array<() => Promise<unknown>> = []

beforeAll(async () => {
  pki = makeTestPki()
  etcd = await startMtlsEtcd(pki)
  admin = new Etcd3({
    hosts: etcd.endpoint,
    credentials: { rootCertificate: pki.ca.cert, certChain: pki.client.cert, privateKey: pki.client.key }
  })
}, 30_000)

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined)
})

afterAll(async () => {
  admin?.close()
  await etcd?.dispose()
  pki?.cleanup()
  process.off("unhandledRejection", onUnhandled)
})

interface Tls {
  readonly ca?: string
  readonly cert?: string
  readonly key?: string
  readonly auth?: { readonly username: string; readonly password: string }
}

const configObject = (prefix: string, tls: Tls, endpoint = etcd.endpoint) => ({
  cluster: {
    name: "c1",
    etcd: [endpoint],
    etcd_prefix: prefix,
    ...(tls.ca !== undefined ? { etcd_ca_file: tls.ca } : {}),
    ...(tls.cert !== undefined ? { etcd_cert_file: tls.cert } : {}),
    ...(tls.key !== undefined ? { etcd_key_file: tls.key } : {}),
    ...(tls.auth !== undefined ? { etcd_username: tls.auth.username, etcd_password: tls.auth.password } : {})
  },
  agent: { node_id: "n1", heartbeat: "200ms", lease_ttl: "1s" },
  models: { m: { hf_repo: "org/m" } }
})

const layerFor = (prefix: string, tls: Tls, endpoint = etcd.endpoint) => {
  const config = layerFromObject(configObject(prefix, tls, endpoint))
  const status = nodeStatusTest({ nodeId: "n1", cluster: "c1", advertiseAddr: "127.0.0.1:7071" })
  return healthReporterLayer.pipe(Layer.provideMerge(Layer.mergeAll(config, status)))
}

const startReporter = async (prefix: string, tls: Tls, endpoint?: string) => {
  const runtime = ManagedRuntime.make(layerFor(prefix, tls, endpoint))
  cleanups.push(() => runtime.dispose())
  await runtime.runPromise(Effect.asVoid(HealthReporter))
  return {
    status: () => runtime.runPromise(Effect.flatMap(HealthReporter, (r) => r.status)),
    reloadTls: () => runtime.runPromise(Effect.flatMap(HealthReporter, (r) => r.reloadTls))
  }
}

const untilState = (r: { status: () => Promise<RegistrationStatus> }, state: RegistrationStatus["state"]) =>
  pollUntil(`reporter state ${state}`, async () => {
    const s = await r.status()
    return s.state === state ? s : undefined
  })

const uniquePrefix = () => `/tls${process.pid}-${++counter}`

describe("HealthReporter over TLS against a real etcd", () => {
  it("registers over TLS with a client certificate: key present, attached to the lease", async () => {
    const prefix = uniquePrefix()
    const key = nodeKey(prefix, "c1", "n1")
    const r = await startReporter(prefix, { ca: pki.ca.certFile, cert: pki.client.certFile, key: pki.client.keyFile })
    const st = await untilState(r, "registered")
    const kv = await pollUntil("key", async () => (await admin.get(key).exec()).kvs[0])
    expect(kv.lease).toBe(st.leaseId)
    const ttl = await admin.leaseClient.leaseTimeToLive({ ID: st.leaseId!, keys: true })
    expect(ttl.keys.map((k) => k.toString())).toContain(key)
    expect(NodeHealth.fromJSON(JSON.parse(kv.value.toString())).nodeId).toBe("n1")
  }, 15_000)

  it("etcd requires a client certificate and the agent has none: retrying with a clear error, no crash", async () => {
    const r = await startReporter(uniquePrefix(), { ca: pki.ca.certFile })
    const st = await untilState(r, "retrying")
    expect(st.lastError).toMatch(
      /^etcd lease grant failed: TLS handshake refused by etcd: it requires a client certificate/
    )
    expect(st.lastError).toContain("cluster.etcd_cert_file")
    expect(st.writes).toBe(0)
    // still running: it keeps retrying
    await pollUntil("more retries", async () =>
      (await r.status()).writeFailures > st.writeFailures ? true : undefined
    )
  }, 15_000)

  it("a client certificate replaced on disk is taken on reloadTls (SIGHUP): from refused to registered, no restart", async () => {
    // The agent's files start as a pair etcd does not trust (signed by another CA), as after a botched rotation.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-etcd-rotate-"))
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }))
    const cert = path.join(dir, "client.crt")
    const key = path.join(dir, "client.key")
    fs.copyFileSync(pki.otherClient.certFile, cert)
    fs.copyFileSync(pki.otherClient.keyFile, key)
    const r = await startReporter(uniquePrefix(), { ca: pki.ca.certFile, cert, key })
    const refused = await untilState(r, "retrying")
    expect(refused.lastError).toContain("TLS handshake refused by etcd")
    // unchanged files: nothing to do, still refused
    await r.reloadTls()
    expect((await r.status()).state).toBe("retrying")
    // the rotation fixed on disk, then SIGHUP's reload: registered with the new pair
    fs.copyFileSync(pki.client.certFile, cert)
    fs.copyFileSync(pki.client.keyFile, key)
    await r.reloadTls()
    const st = await untilState(r, "registered")
    expect(st.writes).toBeGreaterThan(0)
  }, 20_000)

  it("a reload with a file that is no longer PEM keeps the working client: still registered", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-etcd-rotate-"))
    cleanups.push(async () => fs.rmSync(dir, { recursive: true, force: true }))
    const cert = path.join(dir, "client.crt")
    const key = path.join(dir, "client.key")
    fs.copyFileSync(pki.client.certFile, cert)
    fs.copyFileSync(pki.client.keyFile, key)
    const r = await startReporter(uniquePrefix(), { ca: pki.ca.certFile, cert, key })
    const before = await untilState(r, "registered")
    fs.writeFileSync(cert, "not a certificate\n")
    // the problem it warned of is its result: the SIGHUP's config-file line (programs/hangup.ts) leaves out that one,
    // which the file's preflight lists in the same words
    const said = await r.reloadTls()
    expect(said).toContain("cluster.etcd_cert_file")
    const decoded = decodeConfigObject(configObject("/p", { ca: pki.ca.certFile, cert, key }), undefined)
    if (decoded._tag !== "Success") throw new Error("the config decodes")
    const refused = await Effect.runPromise(Effect.flip(preflight(decoded.success)))
    expect(refused.problems).toContain(said)
    const after = await pollUntil("more writes", async () => {
      const s = await r.status()
      return s.writes > before.writes + 2 ? s : undefined
    })
    expect(after.state).toBe("registered")
  }, 20_000)

  it("a server certificate from another CA: retrying with a clear error", async () => {
    const r = await startReporter(uniquePrefix(), {
      ca: pki.otherCa.certFile,
      cert: pki.client.certFile,
      key: pki.client.keyFile
    })
    const st = await untilState(r, "retrying")
    expect(st.lastError).toMatch(/^etcd lease grant failed: etcd's server certificate is not trusted/)
    expect(st.lastError).toContain("cluster.etcd_ca_file")
    expect(st.writes).toBe(0)
  }, 15_000)

  it("server-only TLS (no client certificate) with user/password auth: wrong password retries, right one registers", async () => {
    const plain = await startEtcd({
      tls: {
        certFile: pki.server.certFile,
        keyFile: pki.server.keyFile,
        caFile: pki.ca.certFile,
        clientCertAuth: false
      }
    })
    cleanups.push(() => plain.dispose())
    const root = new Etcd3({ hosts: plain.endpoint, credentials: { rootCertificate: pki.ca.cert } })
    cleanups.push(async () => root.close())
    await root.role("root").create()
    await root.user("root").create("s3cret")
    await root.user("root").addRole("root")
    await root.auth.authEnable({})
    const prefix = uniquePrefix()
    const wrong = await startReporter(
      prefix,
      { ca: pki.ca.certFile, auth: { username: "root", password: "nope" } },
      plain.endpoint
    )
    expect((await untilState(wrong, "retrying")).lastError).toMatch(/auth/i)
    const r = await startReporter(
      prefix,
      { ca: pki.ca.certFile, auth: { username: "root", password: "s3cret" } },
      plain.endpoint
    )
    await untilState(r, "registered")
    const authed = new Etcd3({
      hosts: plain.endpoint,
      credentials: { rootCertificate: pki.ca.cert },
      auth: { username: "root", password: "s3cret" }
    })
    cleanups.push(async () => authed.close())
    const text = await authed.get(nodeKey(prefix, "c1", "n1")).string()
    expect(text === null ? undefined : NodeHealth.fromJSON(JSON.parse(text)).nodeId).toBe("n1")
  }, 20_000)

  it("a plain-http endpoint against the TLS etcd: retrying, no crash", async () => {
    const r = await startReporter(uniquePrefix(), {}, etcd.endpoint.replace("https://", "http://"))
    const st = await untilState(r, "retrying")
    expect(st.lastError).toMatch(/^etcd lease grant failed: /)
    expect(st.writes).toBe(0)
  }, 15_000)

  /** Builds the layer and returns its typed failure (the test fails if it starts). */
  const buildError = async (tls: Tls, tag = "EtcdTlsError") => {
    const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(layerFor(uniquePrefix(), tls))))
    if (Exit.isSuccess(exit)) throw new Error("the layer started")
    const err = Cause.squash(exit.cause) as { _tag?: string; key?: string; message?: string }
    expect(err._tag).toBe(tag)
    return err
  }

  it("a missing cert file fails the layer at start with EtcdTlsError naming cluster.etcd_cert_file", async () => {
    const missing = `${pki.dir}/nope.crt`
    const err = await buildError({ ca: pki.ca.certFile, cert: missing, key: pki.client.keyFile })
    expect(err.key).toBe("etcd_cert_file")
    expect(err.message).toContain(`cluster.etcd_cert_file: cannot read ${missing}`)
  })

  it("half a client pair or a file that is not PEM fails at start naming the key, instead of dying in grpc-js", async () => {
    const noKey = await buildError({ ca: pki.ca.certFile, cert: pki.client.certFile }, "ConfigError")
    expect(noKey.message).toContain("cluster.etcd_cert_file")
    const badCa = await buildError({ ca: pki.client.keyFile, cert: pki.client.certFile, key: pki.client.keyFile })
    expect(badCa.key).toBe("etcd_ca_file")
    const mismatch = await buildError({ ca: pki.ca.certFile, cert: pki.client.certFile, key: pki.server.keyFile })
    expect(mismatch.key).toBe("etcd_key_file")
    expect(mismatch.message).toBe(
      `cluster.etcd_key_file (${pki.server.keyFile}): does not belong to the certificate in cluster.etcd_cert_file`
    )
  })

  it("raised no unhandled rejections", () => {
    expect(unhandled).toBe(0)
  })
})
