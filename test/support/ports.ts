// Free loopback TCP ports for tests: bind 127.0.0.1:0, read the port the kernel chose, release it.
// A small race remains (another process may take the port before the caller binds it); tests accept it
// because the kernel hands out ephemeral ports round-robin, so an immediate reuse is very unlikely.
import * as net from "node:net"

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.unref()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => (port > 0 ? resolve(port) : reject(new Error("no port assigned"))))
    })
  })

/** `n` distinct free ports. */
export const freePorts = async (n: number): Promise<Array<number>> => {
  const ports = new Set<number>()
  while (ports.size < n) ports.add(await freePort())
  return [...ports]
}

const isFree = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.unref()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/** The first of `n` consecutive free ports (engines put data-parallel rank r on port + r). */
export const freePortRange = async (n: number): Promise<number> => {
  for (;;) {
    const base = await freePort()
    if (base + n - 1 > 65535) continue
    let ok = true
    for (let i = 1; i < n && ok; i++) ok = await isFree(base + i)
    if (ok) return base
  }
}
