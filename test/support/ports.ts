// Free loopback TCP ports for tests, chosen below the kernel's ephemeral range (ip_local_port_range) and checked
// free by binding them. Why not bind(0): that hands out a port from the ephemeral range, which is also where
// every outgoing connection's source port comes from; with etcd, engines and agents connecting in parallel test
// files, one of those connections could take the port between the check and the agent's own bind (seen in CI
// as an agent exiting at start with EADDRINUSE). Below the range only another explicit bind can collide, and a
// random pick among ~20,000 ports, checked, makes that unlikely. Where the range cannot be read: bind(0).
// The test workers run in parallel, each with its own record of what it handed out, so each picks from a slice of
// its own (by VITEST_POOL_ID): a port another worker had checked free but its process had not bound yet was handed
// out again here, and one of the two failed to bind (seen in CI: the simulator's "couldn't bind HTTP server socket").
import * as fs from "node:fs"
import * as net from "node:net"

const LOWEST = 10_000
/**
 * The Fetch standard's "bad ports" at or above LOWEST (https://fetch.spec.whatwg.org/#bad-port): Node's fetch
 * (undici) refuses them ("bad port"), so an agent whose admin port is one never reads ready to a test (seen once in
 * a full run, with 10080).
 */
const FETCH_BAD_PORTS = new Set([10080])

/** Slices of the range below the ephemeral one: more than vitest.config.ts's workers. */
const SLICES = 8

/** The first port of the kernel's ephemeral range, or undefined where /proc does not say. */
const ephemeralLow = ((): number | undefined => {
  try {
    const low = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])
    return Number.isInteger(low) && low > LOWEST + 1_000 ? low : undefined
  } catch {
    return undefined
  }
})()

/** This worker's slice of [LOWEST, ephemeralLow): its first port and its size (the whole range outside vitest). */
const slice = ((): { first: number; size: number } | undefined => {
  if (ephemeralLow === undefined) return undefined
  const pool = Number(process.env.VITEST_POOL_ID)
  const whole = ephemeralLow - LOWEST
  if (!Number.isInteger(pool) || pool < 1) return { first: LOWEST, size: whole }
  const size = Math.floor(whole / SLICES)
  return { first: LOWEST + ((pool - 1) % SLICES) * size, size }
})()

const isFree = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.unref()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/** A port the kernel picks (bind 0): in the ephemeral range. */
const kernelPort = (): Promise<number> =>
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

/**
 * Ports this test process has handed out: never handed out twice. A test that picks two ports before binding
 * either (an engine's HTTP and KV-event ports) would otherwise get the same one now and then, and its process
 * fail to start with EADDRINUSE on its own port (seen in CI).
 */
const handedOut = new Set<number>()

/** A TCP port on 127.0.0.1 that was free a moment ago, and not handed out before by this process. */
export const freePort = async (): Promise<number> => {
  if (slice !== undefined) {
    for (let tries = 0; tries < 100; tries++) {
      const port = slice.first + Math.floor(Math.random() * slice.size)
      if (handedOut.has(port) || FETCH_BAD_PORTS.has(port) || !(await isFree(port))) continue
      handedOut.add(port)
      return port
    }
  }
  for (;;) {
    const port = await kernelPort()
    if (handedOut.has(port)) continue
    handedOut.add(port)
    return port
  }
}

/** `n` distinct free ports. */
export const freePorts = async (n: number): Promise<Array<number>> => {
  const ports = new Set<number>()
  while (ports.size < n) ports.add(await freePort())
  return [...ports]
}

/** The first of `n` consecutive free ports (engines put data-parallel rank r on port + r). */
export const freePortRange = async (n: number): Promise<number> => {
  for (;;) {
    const base = await freePort()
    if (base + n - 1 > 65535) continue
    let ok = true
    for (let i = 1; i < n && ok; i++) ok = !handedOut.has(base + i) && (await isFree(base + i))
    if (!ok) continue
    for (let i = 1; i < n; i++) handedOut.add(base + i)
    return base
  }
}
