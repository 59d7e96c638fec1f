import { ChannelCredentials } from "@grpc/grpc-js"
import { Effect, Layer, ManagedRuntime } from "effect"
import { ClientError, createChannel, createClient, Status } from "nice-grpc"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AgentDefinition } from "../../src/gen/cgn/agent/v1/agent.ts"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { layerWith as tlsLayerWith } from "../../src/layers/tls/Tls.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { Metrics } from "../../src/services/observability/Metrics.ts"
import { Tls } from "../../src/services/tls/Tls.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { runCli } from "../support/cli.ts"
import { type SimHandle, startSim } from "../support/sim.ts"

describe("mTLS on the Agent gRPC server", () => {
  let pki: TestPki
  let sim: SimHandle
  let rt: ManagedRuntime.ManagedRuntime<GrpcServer | Metrics, unknown>
  let address: string

  beforeAll(async () => {
    pki = makeTestPki()
    sim = await startSim({ flavor: "vllm", args: ["serve", "m", "--sim-mode", "echo"] })
    const { deps } = agentDeps(sim.url, { agent: { node_id: "node-tls" } })
    const tls = tlsLayerWith(
      { require_mtls: true, ca_file: pki.ca.certFile, cert_file: pki.server.certFile, key_file: pki.server.keyFile },
      { watch: false, sighup: false }
    )
    // As programs/main.ts: the server listens with the Tls service's material.
    const server = Layer.unwrap(
      Effect.map(Tls, (t) => grpcLayerWith({ address: "127.0.0.1:0", tls: t.serverTls, shutdownGraceMs: 500 }))
    ).pipe(Layer.provide(tls), Layer.provide(deps), Layer.provideMerge(MetricsTest.layerTest))
    rt = ManagedRuntime.make(server)
    address = (await rt.runPromise(GrpcServer)).address
  })
  afterAll(async () => {
    await rt?.dispose()
    await sim?.stop()
    pki?.cleanup()
  })

  const call = async (credentials: ChannelCredentials) => {
    const channel = createChannel(address, credentials)
    try {
      let text = ""
      for await (const r of createClient(AgentDefinition, channel).generate({ prompt: "over tls", requestId: "t" }))
        if (r.delta !== undefined) text += r.delta.text
      return { status: "OK", text }
    } catch (e) {
      if (!(e instanceof ClientError)) throw e
      return { status: Status[e.code], text: e.details }
    } finally {
      channel.close()
    }
  }

  it("accepts a client certificate from the CA: a Generate is answered", async () => {
    const r = await call(ChannelCredentials.createSsl(pki.ca.cert, pki.client.key, pki.client.cert))
    expect(r).toEqual({ status: "OK", text: "over tls" })
  })

  it("refuses a client without a certificate, with one from another CA, and plaintext; each certificate refusal counted", async () => {
    // a router's certificate refused was a debug line of "socket hang up"; one that sent none was not counted at all
    const refusals = async () => {
      const page = (await rt.runPromise(Effect.flatMap(Metrics, (m) => m.render))).body
      const line = page
        .split("\n")
        .find((l) => l.startsWith('cgn_agent_grpc_connections_refused_total{reason="client_certificate"}'))
      return Number(line?.split(" ")[1])
    }
    const before = await refusals()
    expect((await call(ChannelCredentials.createSsl(pki.ca.cert))).status).toBe("UNAVAILABLE")
    const afterNoCert = await refusals()
    expect(afterNoCert).toBeGreaterThan(before)
    const otherCa = ChannelCredentials.createSsl(pki.ca.cert, pki.otherClient.key, pki.otherClient.cert)
    expect((await call(otherCa)).status).toBe("UNAVAILABLE")
    expect(await refusals()).toBeGreaterThan(afterNoCert)
    expect((await call(ChannelCredentials.createInsecure())).status).toBe("UNAVAILABLE")
  })

  const runGenerate = (args: ReadonlyArray<string>) => runCli(["generate", ...args])

  it("the generate client with --ca --cert --key; refused without the client certificate", async () => {
    const [ok, refused] = await Promise.all([
      runGenerate([
        "--addr",
        address,
        "--ca",
        pki.ca.certFile,
        "--cert",
        pki.client.certFile,
        "--key",
        pki.client.keyFile,
        "--prompt",
        "hello tls"
      ]),
      runGenerate(["--addr", address, "--ca", pki.ca.certFile, "--prompt", "hello tls", "--timeout", "10"])
    ])
    expect([ok.code, ok.stdout]).toEqual([0, "hello tls\n"])
    expect(refused.code).not.toBe(0)
    expect(refused.stderr).toMatch(/UNAVAILABLE/)
  })

  it("generate --server-name checks the certificate for that name, not the address dialled", async () => {
    const mtls = ["--ca", pki.ca.certFile, "--cert", pki.client.certFile, "--key", pki.client.keyFile]
    const at = (name: string) =>
      runGenerate(["--addr", address, ...mtls, "--server-name", name, "--prompt", "named", "--timeout", "10"])
    // The server's certificate names 127.0.0.1 and localhost (test/support/certs.ts).
    const [named, otherName, noCa] = await Promise.all([
      at("localhost"),
      at("gpu-7.example"),
      runGenerate(["--addr", address, "--server-name", "localhost", "--prompt", "x"])
    ])
    expect([named.code, named.stdout]).toEqual([0, "named\n"])
    // No IP address set as the TLS server name: Node's DEP0123 warning is not printed.
    expect(named.stderr).not.toMatch(/DEP0123/)
    expect(otherName.code).not.toBe(0)
    expect(otherName.stderr).toMatch(/UNAVAILABLE/)
    expect([noCa.code, noCa.stderr]).toEqual([1, "cgn-agent: --server-name is a TLS check: give --ca too\n"])
    const empty = await runGenerate(["--addr", address, ...mtls, "--server-name", "", "--prompt", "x"])
    expect([empty.code, empty.stderr]).toEqual([
      1,
      "cgn-agent: --server-name: expected the name the agent's certificate holds\n"
    ])
  })
})
