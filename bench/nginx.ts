// nginx as a plain SSE reverse proxy in front of the simulator: what a user could put in front of an engine
// instead of the agent, measured by the relay bench on the same load. Debian `nginx-light`, one process
// (`master_process off`, so its CPU and RSS are one /proc entry), its own config, logs, temp paths and pid file in
// a temp dir, `proxy_buffering off` (each SSE chunk is forwarded as it arrives), HTTP/1.1 with upstream keepalive.
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pollUntil } from "../test/support/poll.ts"
import { freePort } from "../test/support/ports.ts"

export interface NginxHandle {
  readonly url: string
  readonly pid: number
  stop(): Promise<void>
}

const NGINX = "/usr/sbin/nginx"

/** Fails with a clear message when nginx is not installed: the bench never skips the nginx column silently. */
export const checkNginx = (): string => {
  // `nginx -v` prints its version on stderr.
  const r = spawnSync(NGINX, ["-v"], { encoding: "utf8" })
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === "ENOENT")
    throw new Error(
      `bench: ${NGINX} not found. The relay bench compares the agent with nginx as a plain SSE proxy; install it ` +
        "with `apt-get update && apt-get install -y nginx-light` (Debian), then rerun."
    )
  if (r.error !== undefined || r.status !== 0)
    throw new Error(`bench: ${NGINX} -v failed: ${r.error?.message ?? r.stderr}`)
  return r.stderr.trim()
}

const config = (dir: string, port: number, upstreamPort: number): string => `
daemon off;
master_process off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 8192; }
http {
  access_log ${dir}/access.log;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream engine {
    server 127.0.0.1:${upstreamPort};
    keepalive 1024;
    keepalive_requests 100000;
  }
  server {
    listen 127.0.0.1:${port};
    keepalive_requests 100000;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
`

const accepts = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const s = connect(port, "127.0.0.1")
    s.once("connect", () => {
      s.destroy()
      resolve(true)
    })
    s.once("error", () => resolve(false))
  })

/** Starts nginx (pinned to `cpu` when given) in front of `upstreamUrl`; resolves once it accepts connections. */
export const startNginx = async (upstreamUrl: string, cpu: number | undefined): Promise<NginxHandle> => {
  checkNginx()
  const dir = mkdtempSync(join(tmpdir(), "cgn-bench-nginx-"))
  const port = await freePort()
  const conf = join(dir, "nginx.conf")
  writeFileSync(conf, config(dir, port, Number(new URL(upstreamUrl).port)))
  // taskset execs nginx: the child's pid is nginx's.
  const args = [NGINX, "-p", dir, "-c", conf]
  const proc: ChildProcess = spawn(
    cpu === undefined ? NGINX : "taskset",
    cpu === undefined ? args.slice(1) : ["-c", String(cpu), ...args],
    {
      stdio: ["ignore", "ignore", "pipe"]
    }
  )
  let stderr = ""
  proc.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString()
  })
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()))
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill("SIGQUIT")
      const t = setTimeout(() => proc.kill("SIGKILL"), 3000)
      await exited
      clearTimeout(t)
    }
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    const up = await pollUntil(
      "nginx to accept connections",
      async () => (proc.exitCode !== null ? "exited" : (await accepts(port)) ? "up" : false),
      10_000
    )
    if (up === "exited") {
      let log = ""
      try {
        log = readFileSync(join(dir, "error.log"), "utf8")
      } catch {}
      throw new Error(`nginx exited (${proc.exitCode}): ${stderr}${log}`)
    }
  } catch (e) {
    await stop()
    throw e
  }
  return { url: `http://127.0.0.1:${port}`, pid: proc.pid ?? -1, stop }
}
