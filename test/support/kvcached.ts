// The reference kvcached receiver, for tests that run it as its own process.
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { KV_WIRE_VERSION } from "../../src/services/kv/KvcachedRpc.ts"
import { followLines } from "./lines.ts"

/** The receiver program's source entry (Node 24 runs the .ts as is). */
export const receiverEntry = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "../../src/programs/kvcachedReceiver.ts"
)

/** A Hello request line of the kvcached contract, as an agent sends it first on a connection. */
export const helloLine = (id: number): string =>
  `${JSON.stringify({
    _tag: "Request",
    id,
    tag: "Hello",
    payload: {
      version: KV_WIRE_VERSION,
      node_id: "n1",
      cluster: "c1",
      model: "m",
      engine: "vllm",
      block_size: 16,
      dp_size: 1,
      epoch: "e1"
    },
    headers: []
  })}\n`

/** Connects to `uds` and resolves with the socket once connected (a stopped receiver's kernel still accepts). */
export const connectUds = (uds: string): Promise<net.Socket> =>
  new Promise((resolve, reject) => {
    const socket = net.connect(uds)
    socket.once("error", reject)
    socket.once("connect", () => resolve(socket))
  })

/** The first answer line of whoever listens on `uds` to a Hello, on a fresh connection closed by `cleanups`. */
export const answerHello = async (uds: string, id: number, cleanups: Array<() => unknown>): Promise<unknown> => {
  const socket = await connectUds(uds)
  cleanups.push(() => socket.destroy())
  const line = followLines(socket).waitFor(() => true, 20_000, `the answer to Hello ${id}`)
  socket.write(helloLine(id))
  return JSON.parse(await line)
}
