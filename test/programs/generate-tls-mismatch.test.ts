// `cgn-agent generate` against an agent whose TLS the flags do not match, said in the operator's words, not OpenSSL's:
// --ca against a plaintext agent (OpenSSL's "wrong version number"), no --ca against an mTLS agent (grpc-js's bare
// "Failed to connect", with the time it appends), --ca without --cert against one (the "certificate required" alert).
// Real agent gRPC servers (layers/grpc/GrpcServer.ts), one plaintext, one with mTLS as programs/main.ts builds it.
import { Effect, Layer, ManagedRuntime } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerWith as grpcLayerWith } from "../../src/layers/grpc/GrpcServer.ts"
import { layerWith as tlsLayerWith } from "../../src/layers/tls/Tls.ts"
import { failureDetails, shortDetails } from "../../src/programs/connectFailure.ts"
import { GrpcServer } from "../../src/services/grpc/GrpcServer.ts"
import { Tls } from "../../src/services/tls/Tls.ts"
import * as MetricsTest from "../../src/testing/Metrics.ts"
import { agentDeps } from "../support/agentDeps.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { runCli } from "../support/cli.ts"

describe("generate against an agent whose TLS the flags do not match", () => {
  let pki: TestPki
  const runtimes: Array<ManagedRuntime.ManagedRuntime<GrpcServer, unknown>> = []
  let mtls = ""
  let plain = ""

  beforeAll(async () => {
    pki = makeTestPki()
    // no engine is reached: every call here ends at the connection
    const { deps } = agentDeps("http://127.0.0.1:9")
    const tls = tlsLayerWith(
      { require_mtls: true, ca_file: pki.ca.certFile, cert_file: pki.server.certFile, key_file: pki.server.keyFile },
      { watch: false, sighup: false }
    )
    const start = async (layer: Layer.Layer<GrpcServer, unknown>) => {
      const rt = ManagedRuntime.make(layer)
      runtimes.push(rt)
      return (await rt.runPromise(GrpcServer)).address
    }
    const base = { address: "127.0.0.1:0", shutdownGraceMs: 500 }
    mtls = await start(
      Layer.unwrap(Effect.map(Tls, (t) => grpcLayerWith({ ...base, tls: t.serverTls }))).pipe(
        Layer.provide(tls),
        Layer.provide(deps),
        Layer.provide(MetricsTest.layerTest)
      )
    )
    plain = await start(grpcLayerWith(base).pipe(Layer.provide(deps), Layer.provide(MetricsTest.layerTest)))
  })
  afterAll(async () => {
    for (const rt of runtimes) await rt.dispose()
    pki?.cleanup()
  })

  /** The CLI's exit code and its last stderr line (Node's DEP0123 warning for a TLS dial of an IP comes before it). */
  const generate = async (args: ReadonlyArray<string>) => {
    const r = await runCli(["generate", "--prompt", "hi", "--timeout", "10", ...args])
    return { code: r.code, last: r.stderr.trim().split("\n").at(-1) }
  }
  const client = () => ["--cert", pki.client.certFile, "--key", pki.client.keyFile]

  it("--ca against a plaintext agent: it answered without TLS, drop --ca (was OpenSSL's 'wrong version number')", async () => {
    for (const args of [
      ["--ca", pki.ca.certFile],
      ["--ca", pki.ca.certFile, ...client()]
    ])
      expect(await generate(["--addr", plain, ...args])).toEqual({
        code: 1,
        last: `cgn-agent: UNAVAILABLE: cannot connect: the agent at ${plain} answered without TLS (plaintext gRPC: its security.require_mtls is off): drop --ca, --cert and --key`
      })
  })

  it("no --ca against an mTLS agent: give --ca, --cert and --key (was 'Failed to connect (<time>)')", async () => {
    expect(await generate(["--addr", mtls])).toEqual({
      code: 1,
      last: `cgn-agent: UNAVAILABLE: cannot connect: ${mtls} closed the connection before any gRPC answer: an agent with security.require_mtls on speaks only TLS; give --ca, --cert and --key`
    })
  })

  it("--ca without --cert against an mTLS agent: give --cert and --key (was OpenSSL's 'alert certificate required')", async () => {
    expect(await generate(["--addr", mtls, "--ca", pki.ca.certFile])).toEqual({
      code: 1,
      last: `cgn-agent: UNAVAILABLE: cannot connect: the agent at ${mtls} requires a client certificate (security.require_mtls): give --cert and --key`
    })
  })

  it("matched on OpenSSL's reason, not its codes; other failures keep grpc-js's words, shortened, without its timestamp", () => {
    const openssl = (reason: string) =>
      `No connection established. Last error: Error: 0123ABCD:error:0A00010B:SSL routines:any_function:${reason}:../deps/x.c:1: (2030-01-01T00:00:00.000Z). Resolution note: `
    const flags = { ca: true, cert: true }
    expect(failureDetails(openssl("wrong version number"), "h:1", flags)).toMatch(/answered without TLS/)
    // the same words with no --ca cannot be that mismatch: left as they are
    expect(failureDetails(openssl("wrong version number"), "h:1", { ca: false, cert: false })).toMatch(
      /^cannot connect: 0123ABCD:error:.*wrong version number/
    )
    // a certificate offered and still refused is not the missing-certificate case
    expect(failureDetails(openssl("tlsv13 alert certificate required"), "h:1", flags)).not.toMatch(/give --cert/)
    expect(
      failureDetails(
        "No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:1 (2030-01-01T00:00:00.000Z). Resolution note: ",
        "127.0.0.1:1",
        { ca: false, cert: false }
      )
    ).toBe("cannot connect: connect ECONNREFUSED 127.0.0.1:1")
    expect(shortDetails("No connection established. Last error: Failed to connect (2030-01-01T00:00:00.000Z)")).toBe(
      "cannot connect: Failed to connect"
    )
  })
})
