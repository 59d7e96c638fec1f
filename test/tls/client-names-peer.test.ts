// security.allowed_client_names on node:http2 (layers/grpc/http2/clientNames.ts): the check is asked with each
// connection's client address, so the refusal's log names the peer, and two hosts presenting the same refused
// certificate are warned about each (the warning's window is per address and names), over real mTLS connections
// from two loopback addresses.
import * as http2 from "node:http2"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"
import { makeClientNameCheck } from "../../src/layers/tls/clientNameCheck.ts"
import { frameMessage } from "../../src/services/grpc/Wire.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"

let pki: TestPki
beforeAll(() => {
  pki = makeTestPki()
})
afterAll(() => pki?.cleanup())

/** One call from `from` on its own connection with the PKI's client certificate (CN=client): its grpc-status. */
const callFrom = (port: number, from: string) =>
  new Promise<string | undefined>((resolve) => {
    const session = http2.connect(`https://localhost:${port}`, {
      host: "127.0.0.1",
      localAddress: from,
      ca: pki.ca.cert,
      cert: pki.client.cert,
      key: pki.client.key
    } as http2.SecureClientSessionOptions)
    session.on("error", () => {})
    const req = session.request({
      ":method": "POST",
      ":path": "/t.T/Echo",
      "content-type": "application/grpc",
      te: "trailers"
    })
    let status: string | undefined
    const head = (h: http2.IncomingHttpHeaders) => (status = (h["grpc-status"] as string | undefined) ?? status)
    req.on("response", head)
    req.on("trailers", head)
    req.on("error", () => {})
    req.resume()
    req.on("close", () => {
      session.destroy()
      resolve(status)
    })
    req.end(frameMessage(Buffer.from("hi")))
  })

describe("the client-name check on the gRPC server", () => {
  it("is asked with the connection's client address: each refused host is named and warned about", async () => {
    const warnings: Array<Readonly<Record<string, string | number>>> = []
    const checking = makeClientNameCheck(["router.cgn.svc"], (warn, _line, fields) => {
      if (warn) warnings.push(fields)
    })
    const material = { ca: pki.ca.cert, cert: pki.server.cert, key: pki.server.key }
    const server = new Http2GrpcServer({
      maxReceiveMessageLength: 1024,
      tls: { current: () => material, subscribe: () => () => {}, clientNames: checking.check }
    })
    try {
      const port = await server.listen("127.0.0.1", 0)
      expect(await callFrom(port, "127.0.0.2")).toBe("7")
      expect(await callFrom(port, "127.0.0.3")).toBe("7")
      expect(warnings).toEqual([
        { peer: "127.0.0.2", names: "CN=client" },
        { peer: "127.0.0.3", names: "CN=client" }
      ])
      expect(checking.refused()).toBe(2)
    } finally {
      server.destroy()
    }
  })
})
