/**
 * Test harness: a real single-member etcd (Debian `etcd-server`, /usr/bin/etcd) on free loopback client
 * and peer ports with its own temp data dir. Supports the faults the HealthReporter tests need: stop
 * (SIGTERM), kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT) and restart on the same ports and data dir.
 * Every instance is tracked and killed on dispose() and, as a last resort, when the test process exits.
 * With `tls` the client URLs are https (optionally requiring client certificates).
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as fs from "node:fs/promises"
import * as https from "node:https"
import * as os from "node:os"
import * as path from "node:path"
import { freePorts } from "./ports.ts"

export interface EtcdHandle {
  /** `http://127.0.0.1:PORT` (`https://` with `tls`), what [cluster].etcd takes. */
  readonly endpoint: string
  readonly clientPort: number
  readonly peerPort: number
  readonly dataDir: string
  /** The current process id (changes on restart). */
  readonly pid: () => number | undefined
  /** The last stderr lines, for failure messages. */
  readonly logTail: () => string
  /** SIGTERM and wait for exit. */
  readonly stop: () => Promise<void>
  /** SIGKILL and wait for exit. */
  readonly kill: () => Promise<void>
  /** SIGSTOP: the process freezes, its sockets stay open. */
  readonly pause: () => void
  /** SIGCONT. */
  readonly resume: () => void
  /** Start again on the same ports and data dir (after stop/kill), and await readiness. */
  readonly restart: () => Promise<void>
  /** Kill the process and remove the data dir. Safe to call more than once. */
  readonly dispose: () => Promise<void>
}

const ETCD = process.env.ETCD_BIN ?? "etcd"
const live = new Set<ChildProcess>()
process.once("exit", () => {
  for (const p of live) p.kill("SIGKILL")
})

const exited = (p: ChildProcess): Promise<void> =>
  p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise((r) => p.once("exit", () => r()))

/** GET `/health` over https, trusting `ca` and presenting the client pair when given. */
const healthOverTls = (url: string, tls: EtcdTls): Promise<{ ok: boolean; body: { health?: string } }> =>
  Promise.all([
    fs.readFile(tls.caFile),
    tls.clientCertFile === undefined ? undefined : fs.readFile(tls.clientCertFile),
    tls.clientKeyFile === undefined ? undefined : fs.readFile(tls.clientKeyFile)
  ]).then(
    ([ca, cert, key]) =>
      new Promise((resolve, reject) => {
        const req = https.get(url, { ca, ...(cert ? { cert } : {}), ...(key ? { key } : {}), timeout: 500 }, (res) => {
          let text = ""
          res.setEncoding("utf8")
          res.on("data", (d: string) => {
            text += d
          })
          res.on("end", () => {
            try {
              resolve({ ok: res.statusCode === 200, body: JSON.parse(text) as { health?: string } })
            } catch (e) {
              reject(e)
            }
          })
          res.on("error", reject)
        })
        req.on("timeout", () => req.destroy(new Error("timeout")))
        req.on("error", reject)
      })
  )

/** Polls `/health` until etcd answers healthy, or fails after `timeoutMs`. */
const awaitHealthy = async (
  endpoint: string,
  proc: ChildProcess,
  logTail: () => string,
  timeoutMs: number,
  tls: EtcdTls | undefined
) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      throw new Error(`etcd exited early (${proc.exitCode ?? proc.signalCode}):\n${logTail()}`)
    }
    try {
      if (tls !== undefined) {
        const res = await healthOverTls(`${endpoint}/health`, tls)
        if (res.ok && res.body.health === "true") return
      } else {
        const res = await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(500) })
        const body = (await res.json()) as { health?: string }
        if (res.ok && body.health === "true") return
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 25))
  }
  throw new Error(`etcd at ${endpoint} not healthy after ${timeoutMs}ms:\n${logTail()}`)
}

/** TLS for the client URLs (peers stay plain http on loopback). */
export interface EtcdTls {
  /** The server certificate and key etcd presents. */
  readonly certFile: string
  readonly keyFile: string
  /** The CA that signed the server certificate (the readiness poll trusts it); with `clientCertAuth`, also
   * etcd's `--trusted-ca-file` for client certificates. */
  readonly caFile: string
  /** `--client-cert-auth --trusted-ca-file`: refuse clients without a certificate signed by `caFile`.
   * Without it etcd gets no `--trusted-ca-file`, since etcd 3.4 then demands client certificates anyway. */
  readonly clientCertAuth: boolean
  /** The client pair the readiness poll presents; required with `clientCertAuth`. */
  readonly clientCertFile?: string
  readonly clientKeyFile?: string
}

export interface StartEtcdOptions {
  /** Readiness bound, default 15 s. */
  readonly readyTimeoutMs?: number
  /** Serve clients over https (`--cert-file --key-file --trusted-ca-file [--client-cert-auth]`). */
  readonly tls?: EtcdTls
}

/**
 * Starts etcd and resolves once it is healthy. Its raft timers are shortened (heartbeat 10ms, election
 * 100ms) so that the smallest lease TTL etcd accepts is 1 s, as the TTL tests need.
 */
export const startEtcd = async (options: StartEtcdOptions = {}): Promise<EtcdHandle> => {
  const readyTimeoutMs = options.readyTimeoutMs ?? 15_000
  const tls = options.tls
  if (tls?.clientCertAuth === true && (tls.clientCertFile === undefined || tls.clientKeyFile === undefined)) {
    throw new Error("startEtcd: tls.clientCertAuth needs tls.clientCertFile and clientKeyFile for the readiness poll")
  }
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-etcd-"))
  const [clientPort, peerPort] = (await freePorts(2)) as [number, number]
  const endpoint = `${tls === undefined ? "http" : "https"}://127.0.0.1:${clientPort}`
  const peer = `http://127.0.0.1:${peerPort}`
  const args = [
    "--name=test",
    `--data-dir=${path.join(dataDir, "data")}`,
    `--listen-client-urls=${endpoint}`,
    `--advertise-client-urls=${endpoint}`,
    `--listen-peer-urls=${peer}`,
    `--initial-advertise-peer-urls=${peer}`,
    `--initial-cluster=test=${peer}`,
    "--initial-cluster-state=new",
    "--heartbeat-interval=10",
    "--election-timeout=100",
    "--logger=zap",
    "--log-level=warn",
    ...(tls === undefined
      ? []
      : [
          `--cert-file=${tls.certFile}`,
          `--key-file=${tls.keyFile}`,
          ...(tls.clientCertAuth ? [`--trusted-ca-file=${tls.caFile}`, "--client-cert-auth"] : [])
        ])
  ]
  const lines: Array<string> = []
  const logTail = () => lines.slice(-30).join("\n")
  let proc: ChildProcess | undefined
  let disposed = false

  const launch = async () => {
    const p = spawn(ETCD, args, { stdio: ["ignore", "ignore", "pipe"] })
    live.add(p)
    p.once("exit", () => live.delete(p))
    p.once("error", (e) => lines.push(`spawn error: ${e.message}`))
    p.stderr?.setEncoding("utf8")
    p.stderr?.on("data", (chunk: string) => {
      for (const l of chunk.split("\n")) if (l.length > 0) lines.push(l)
      if (lines.length > 200) lines.splice(0, lines.length - 200)
    })
    proc = p
    await awaitHealthy(endpoint, p, logTail, readyTimeoutMs, tls)
  }

  const signalAndWait = async (signal: NodeJS.Signals) => {
    const p = proc
    if (p === undefined || p.exitCode !== null || p.signalCode !== null) return
    // A stopped process does not act on SIGTERM until it is continued.
    p.kill("SIGCONT")
    p.kill(signal)
    await exited(p)
  }

  const handle: EtcdHandle = {
    endpoint,
    clientPort,
    peerPort,
    dataDir,
    pid: () => proc?.pid,
    logTail,
    stop: () => signalAndWait("SIGTERM"),
    kill: () => signalAndWait("SIGKILL"),
    pause: () => {
      proc?.kill("SIGSTOP")
    },
    resume: () => {
      proc?.kill("SIGCONT")
    },
    restart: async () => {
      await signalAndWait("SIGKILL")
      await launch()
    },
    dispose: async () => {
      if (disposed) return
      disposed = true
      await signalAndWait("SIGKILL")
      await fs.rm(dataDir, { recursive: true, force: true })
    }
  }
  try {
    await launch()
  } catch (e) {
    await handle.dispose()
    throw e
  }
  return handle
}

/**
 * etcd over mTLS with `pki` (test/support/certs.ts): its server pair, clients must present a certificate its CA
 * signed; the readiness poll presents `pki.client`.
 */
export const startMtlsEtcd = (pki: {
  readonly ca: { readonly certFile: string }
  readonly server: { readonly certFile: string; readonly keyFile: string }
  readonly client: { readonly certFile: string; readonly keyFile: string }
}): Promise<EtcdHandle> =>
  startEtcd({
    tls: {
      certFile: pki.server.certFile,
      keyFile: pki.server.keyFile,
      caFile: pki.ca.certFile,
      clientCertAuth: true,
      clientCertFile: pki.client.certFile,
      clientKeyFile: pki.client.keyFile
    }
  })

/** Re-exported for the etcd tests; the implementation is test/support/poll.ts. */
export { pollUntil } from "./poll.ts"
