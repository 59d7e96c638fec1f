// security.allowed_client_names on the Agent gRPC server over real mTLS connections (a throwaway PKI made here with
// openssl): of three client certificates of the same CA, the one the list names (by a one-label DNS wildcard) calls
// Generate; one with other SANs, and one with only a CN, get PERMISSION_DENIED on every call of their connection, with
// a message naming their names and the key. Each refused connection is counted once (TlsStatus.clientsRefused,
// cgn_agent_tls_client_connections_refused_total) and warned about once, however many calls it makes. Without the
// list (absent or empty) there is no check, and the start log says any certificate of the CA may call.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { ChannelCredentials } from "@grpc/grpc-js"
import { Effect, Layer, Logger, ManagedRuntime, References } from "effect"
import { ClientError, createChannel, createClient, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { mirrorTls } from "../../src/layers/observability/Metrics.ts"
import { make, layerWith as tlsLayerWith } from "../../src/layers/tls/Tls.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { Tls } from "../../src/services/tls/Tls.ts"
import { layerTest as metricsLayerTest } from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { type CertFiles, makeTestPki, type TestPki } from "../support/certs.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

/** A client certificate signed by the PKI's CA, with these subjectAltName entries (none: the CN alone). */
const issueClient = (pki: TestPki, name: string, altNames: ReadonlyArray<string>): CertFiles => {
  const dir = pki.dir
  const san = altNames.length === 0 ? "" : `subjectAltName=${altNames.join(",")}\n`
  fs.writeFileSync(path.join(dir, `${name}.ext`), `${san}extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n`)
  const openssl = (args: ReadonlyArray<string>) =>
    execFileSync("/usr/bin/openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] })
  openssl(
    ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"].concat([
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${name}`
    ])
  )
  openssl(
    ["x509", "-req", "-in", `${name}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial"].concat(
      [`0x${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`, "-days", "1", "-out", `${name}.crt`],
      ["-extfile", `${name}.ext`]
    )
  )
  const certFile = path.join(dir, `${name}.crt`)
  const keyFile = path.join(dir, `${name}.key`)
  return { certFile, keyFile, cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) }
}

describe("security.allowed_client_names on the Agent gRPC server", () => {
  let pki: TestPki
  let sim: SimHandle
  let rt: ManagedRuntime.ManagedRuntime<GrpcServer | Tls | Metrics, unknown>
  let address: string
  let router: CertFiles
  let batch: CertFiles
  const lines: Array<string> = []

  beforeAll(async () => {
    pki = makeTestPki()
    router = issueClient(pki, "router", ["DNS:router-0.router.cgn.svc", "URI:spiffe://cluster.local/ns/cgn/sa/router"])
    batch = issueClient(pki, "batch", ["DNS:batch.cgn.svc", "URI:spiffe://cluster.local/ns/batch/sa/job"])
    sim = await startSim({ flavor: "vllm", args: ["serve", "m", "--sim-mode", "echo"] })
    const { deps } = agentDeps(sim.url, { agent: { node_id: "node-names" } })
    const logging = Layer.mergeAll(
      Logger.layer([Logger.make(({ logLevel, message }) => lines.push(`${logLevel} ${[message].flat().join(" ")}`))]),
      Layer.succeed(References.MinimumLogLevel, "Debug")
    )
    const tls = tlsLayerWith(
      {
        require_mtls: true,
        ca_file: pki.ca.certFile,
        cert_file: pki.server.certFile,
        key_file: pki.server.keyFile,
        allowed_client_names: ["*.router.cgn.svc", "spiffe://cluster.local/ns/cgn/sa/prefill"]
      },
      { watch: false, sighup: false }
    ).pipe(Layer.provide(logging))
    // As programs/main.ts: the server listens with the Tls service's material (and its client-name check).
    const server = Layer.unwrap(
      Effect.map(Tls, (t) => grpcLayerWith({ address: "127.0.0.1:0", tls: t.serverTls, shutdownGraceMs: 500 }))
    )
    rt = ManagedRuntime.make(
      server.pipe(Layer.provideMerge(tls), Layer.provideMerge(metricsLayerTest), Layer.provide(deps))
    )
    address = (await rt.runPromise(GrpcServer)).address
  })
  afterAll(async () => {
    await rt?.dispose()
    await sim?.stop()
    pki?.cleanup()
  })

  /** `calls` Generate calls one after another on one channel (one connection): each one's status and text. */
  const generate = async (client: CertFiles, calls = 1) => {
    const channel = createChannel(address, ChannelCredentials.createSsl(pki.ca.cert, client.key, client.cert))
    const out: Array<{ status: string; text: string }> = []
    try {
      for (let i = 0; i < calls; i++) {
        try {
          let text = ""
          for await (const r of createClient(AgentDefinition, channel).generate({ prompt: "named", requestId: "n" }))
            if (r.delta !== undefined) text += r.delta.text
          out.push({ status: "OK", text })
        } catch (e) {
          if (!(e instanceof ClientError)) throw e
          out.push({ status: Status[e.code], text: e.details })
        }
      }
      return out
    } finally {
      channel.close()
    }
  }

  const scrape = () =>
    rt.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          yield* mirrorTls((yield* Tls).status)
          return (yield* (yield* Metrics).render).body
        })
      )
    )

  it("serves a client the list names; refuses every call of a same-CA client it does not, counted once", async () => {
    // The start says which clients are served.
    expect(lines).toContain(
      "Info tls: mTLS on; clients allowed by security.allowed_client_names: *.router.cgn.svc, spiffe://cluster.local/ns/cgn/sa/prefill"
    )
    expect(await generate(router)).toEqual([{ status: "OK", text: "named" }])
    const denied = (names: string) => ({
      status: "PERMISSION_DENIED",
      text: `the client certificate (${names}) is not allowed by security.allowed_client_names on this agent`
    })
    const batchNames = "DNS:batch.cgn.svc, URI:spiffe://cluster.local/ns/batch/sa/job"
    expect(await generate(batch, 3)).toEqual([denied(batchNames), denied(batchNames), denied(batchNames)])
    // No SAN: the CN is read, and "client" is not in the list either.
    expect(await generate(pki.client, 2)).toEqual([denied("CN=client"), denied("CN=client")])
    // Two connections refused (not five calls), each warned about once; the allowed one not at all.
    expect((await rt.runPromise(Effect.flatMap(Tls, (t) => t.status))).clientsRefused).toBe(2)
    const body = await scrape()
    expect(body).toMatch(/^cgn_agent_tls_client_connections_refused_total 2$/m)
    expect(body).toMatch(/^cgn_agent_requests_total\{[^}]*grpc_code="PERMISSION_DENIED"[^}]*\} 5$/m)
    expect(lines.filter((l) => l.startsWith("Warn") && l.includes("allowed_client_names"))).toHaveLength(2)
    // And a named client still gets through afterwards, on a new connection.
    expect(await generate(router)).toEqual([{ status: "OK", text: "named" }])
  })

  it("without the list: no check, no count, and the start says any certificate of the CA may call", async () => {
    const seen: Array<string> = []
    const logger = Logger.layer([Logger.make(({ message }) => seen.push([message].flat().join(" ")))])
    const security = { require_mtls: true, ca_file: pki.ca.certFile, cert_file: pki.server.certFile }
    for (const allowed of [undefined, []]) {
      const files = { ...security, key_file: pki.server.keyFile }
      const service = await Effect.runPromise(
        Effect.scoped(
          make(allowed === undefined ? files : { ...files, allowed_client_names: allowed }, {
            watch: false,
            sighup: false
          })
        ).pipe(Effect.provide(logger))
      )
      expect(service.serverTls?.clientNames).toBeUndefined()
      expect((await Effect.runPromise(service.status)).clientsRefused).toBeUndefined()
    }
    expect(seen.filter((l) => l.startsWith("tls: mTLS on"))).toEqual(
      Array(2).fill(
        "tls: mTLS on; any client certificate that chains to security.ca_file may call (security.allowed_client_names is not set)"
      )
    )
  })
})
