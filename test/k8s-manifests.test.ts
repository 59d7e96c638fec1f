// examples/k8s: the manifests parse as YAML, the ConfigMap's agent.toml is a valid config, and the
// DaemonSet agrees with it (probe ports, GPU count, grace period vs drain, certificate mount paths).
import * as fs from "node:fs"
import * as path from "node:path"
import { Duration, Result } from "effect"
import { describe, expect, it } from "vitest"
import { parseAllDocuments } from "yaml"
import { decodeConfig } from "../src/layers/Config.ts"
import { splitHostPort } from "../src/services/Advertise.ts"

const dir = path.join(import.meta.dirname, "..", "examples", "k8s")

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML; the assertions check the shape
const load = (file: string): Array<any> => {
  const docs = parseAllDocuments(fs.readFileSync(path.join(dir, file), "utf8"))
  for (const d of docs) expect(d.errors, `${file}: ${d.errors.join("; ")}`).toEqual([])
  return docs.map((d) => d.toJS())
}

describe("examples/k8s", () => {
  const [configMap] = load("configmap.yaml")
  const [daemonSet] = load("daemonset.yaml")
  const toml: string = configMap.data["agent.toml"]
  const decoded = decodeConfig(toml, "configmap.yaml:agent.toml", { NODE_NAME: "gpu-node-1", NODE_IP: "10.0.0.9" })

  it("ships a ConfigMap whose agent.toml is a valid config", () => {
    expect(configMap).toMatchObject({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "cgn-agent-config" } })
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    expect(decoded.success.agent.node_id).toBe("gpu-node-1")
  })

  it("ships a DaemonSet that agrees with the config", () => {
    if (Result.isFailure(decoded)) throw new Error(decoded.failure.message)
    const config = decoded.success
    expect(daemonSet).toMatchObject({ apiVersion: "apps/v1", kind: "DaemonSet" })
    const pod = daemonSet.spec.template.spec
    const [agent] = pod.containers
    const grpcPort = Number(splitHostPort(config.agent.listen_grpc).port)
    const adminPort = Number(splitHostPort(config.agent.listen_admin).port)

    expect(agent.startupProbe.grpc.port).toBe(grpcPort)
    expect(agent.readinessProbe.grpc.port).toBe(grpcPort)
    expect(agent.livenessProbe.httpGet).toEqual({ path: "/healthz", port: adminPort })
    // the startup budget outlasts the agent's own engine startup timeout
    const startupS = agent.startupProbe.failureThreshold * agent.startupProbe.periodSeconds
    expect(startupS).toBeGreaterThan(Duration.toSeconds(config.engine.startup_timeout))
    // SIGKILL must not cut the ordered drain short
    const drainS = Duration.toSeconds(config.agent.drain_timeout) + Duration.toSeconds(config.engine.stop_grace)
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThan(drainS)

    expect(agent.resources.limits["nvidia.com/gpu"]).toBe(config.model.tp)
    expect(pod.tolerations).toContainEqual({ key: "nvidia.com/gpu", operator: "Exists", effect: "NoSchedule" })
    expect(Object.keys(pod.nodeSelector)).toContain("nvidia.com/gpu.present")

    const env = Object.fromEntries(agent.env.map((e: { name: string; valueFrom?: unknown }) => [e.name, e.valueFrom]))
    expect(env.NODE_NAME).toEqual({ fieldRef: { fieldPath: "spec.nodeName" } })
    expect(env.NODE_IP).toEqual({ fieldRef: { fieldPath: "status.hostIP" } })

    // every file the config names lies under a mounted volume
    const mounts: Array<string> = agent.volumeMounts.map((m: { mountPath: string }) => m.mountPath)
    const files = [
      config.security.ca_file,
      config.security.cert_file,
      config.security.key_file,
      config.cluster.etcd_ca_file,
      "/etc/cgn-agent/agent.toml"
    ]
    for (const f of files)
      expect(
        mounts.some((m) => f?.startsWith(`${m}/`)),
        `${f} is mounted`
      ).toBe(true)
    expect(mounts).toContain(config.agent.state_dir)
    expect(agent.args).toEqual(["run", "--config", "/etc/cgn-agent/agent.toml"])
  })
})
