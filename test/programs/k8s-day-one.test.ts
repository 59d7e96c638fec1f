// What a first day in a cluster runs into, checked on the shipped examples: the DaemonSet's QoS class (eviction
// order under memory pressure), its host-network admin port (collisions with the node's other daemons), a writable
// home and working directory for the non-root user, and examples/prod.toml serving every host as it is (no address
// of one host baked in).
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { parseAllDocuments } from "yaml"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { splitHostPort } from "../../src/services/net/HostPort.ts"
import { resolveAdvertiseAddr } from "../../src/services/registry/Advertise.ts"

const EXAMPLES = path.join(import.meta.dirname, "..", "..", "examples")
const ENV = { NODE_NAME: "gpu-node-1", NODE_IP: "10.0.0.9", CGN_AGENT_ADMIN_TOKEN: "t0ken" }

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML; the assertions check the shape
type Doc = any

const docs: Array<Doc> = parseAllDocuments(
  execFileSync("kubectl", ["kustomize", path.join(EXAMPLES, "k8s", "overlays", "example")], { encoding: "utf8" })
).map((d) => d.toJS())
const daemonSet = docs.find((d) => d.kind === "DaemonSet")
const pod = daemonSet.spec.template.spec
const agent = pod.containers.find((c: Doc) => c.name === "agent")
const decoded = decodeConfig(docs.find((d) => d.kind === "ConfigMap").data["agent.toml"], "agent.toml", ENV)
if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
const config = decoded.success

describe("examples/k8s on day one", () => {
  it("is Guaranteed QoS: every container, the init container too, requests what it is limited to", () => {
    // Kubernetes' rule (pkg/apis/core/helper/qos GetPodQOS): CPU and memory limits in every container, init
    // containers included, each equal to its request.
    for (const c of [...pod.initContainers, ...pod.containers]) {
      for (const r of ["cpu", "memory"]) {
        expect(c.resources?.limits?.[r], `${c.name} limits.${r}`).toBeDefined()
        expect(String(c.resources?.requests?.[r] ?? c.resources.limits[r]), `${c.name} ${r}`).toBe(
          String(c.resources.limits[r])
        )
      }
    }
  })

  it("puts the admin port on one port everywhere, off ports the node's daemons are known to hold", () => {
    const admin = Number(splitHostPort(config.agent.listen_admin).port)
    // 9091: Calico Felix's metrics and the Prometheus Pushgateway; 9090 Prometheus; 9099 Calico Felix's health;
    // 9100 node-exporter; 9400 DCGM exporter; 10250-10259 kubelet and control plane
    const taken = [9090, 9091, 9099, 9100, 9400, 10250, 10255, 10256, 10257, 10259]
    expect(taken).not.toContain(admin)
    expect(agent.ports.find((p: Doc) => p.name === "admin").containerPort).toBe(admin)
    expect(agent.livenessProbe.httpGet.port).toBe(admin)
    expect(daemonSet.spec.template.metadata.annotations["prometheus.io/port"]).toBe(String(admin))
  })

  it("gives the non-root user a writable home and working directory on the cache volume", () => {
    const env = Object.fromEntries(agent.env.map((e: Doc) => [e.name, e.value]))
    const cache = agent.volumeMounts.find((m: Doc) => m.name === "cache").mountPath
    expect(env.HOME).toMatch(new RegExp(`^${cache}/`))
    expect(env.XDG_CONFIG_HOME).toMatch(new RegExp(`^${cache}/`))
    expect(agent.workingDir).toBe(env.HOME)
    // made and handed over by the init container (the runtime would make a missing workingDir root-owned)
    const init = pod.initContainers.find((c: Doc) => c.name === "cache-owner")
    const script: string = init.command.at(-1)
    expect(script).toContain(`mkdir -p ${env.HOME}`)
    expect(script).toMatch(new RegExp(`chown ${pod.securityContext.runAsUser}:\\d+ .*${env.HOME}`))
  })
})

describe("examples/prod.toml on any host", () => {
  const file = path.join(EXAMPLES, "prod.toml")
  const r = decodeConfig(fs.readFileSync(file, "utf8"), file, {})
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  const prod = r.success

  it("advertises each host's own address, not one baked into the file", () => {
    expect(prod.agent.advertise_addr).toBeUndefined()
    const host = (address: string) => ({ eth0: [{ address, family: "IPv4", internal: false }] })
    const on = (address: string, nodeIp?: string) =>
      resolveAdvertiseAddr({
        advertiseAddr: prod.agent.advertise_addr,
        listenGrpc: prod.agent.listen_grpc,
        nodeIp,
        interfaces: host(address)
      })
    expect([on("10.0.12.7"), on("10.0.12.8")]).toEqual(["10.0.12.7:7071", "10.0.12.8:7071"])
    expect(on("10.0.12.8", "192.168.7.8")).toBe("192.168.7.8:7071")
  })
})
