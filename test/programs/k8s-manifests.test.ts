// examples/k8s: the Kustomize overlay renders (`kubectl kustomize`), every document parses, the ConfigMap's
// agent.toml passes `check`, and the DaemonSet agrees with it (probe ports, GPU count, grace period vs drain,
// mounts, caches, security). Then the shipped config is run for real and probed the way the kubelet probes it:
// a plaintext grpc.health.v1.Health/Check on the probe's port (kubelet pkg/probe/grpc dials insecure).
import { execFileSync } from "node:child_process"
import * as path from "node:path"
import { Duration, Effect, Result } from "effect"
import { createChannel, createClient } from "nice-grpc"
import { HealthDefinition } from "nice-grpc-server-health"
import { parse as parseToml, stringify as stringifyToml } from "smol-toml"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { parseAllDocuments } from "yaml"
import { HealthCheckResponse_ServingStatus } from "../../src/gen/grpc/health/v1/health.ts"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { engineFor } from "../../src/layers/engine/backends/index.ts"
import { preflight } from "../../src/programs/check.ts"
import { shutdownBound } from "../../src/programs/shutdownBound.ts"
import type { AgentConfig } from "../../src/services/config/Config.ts"
import { splitHostPort } from "../../src/services/net/HostPort.ts"
import { killAllAgents, simDistEntry, startAgent } from "../support/agent.ts"
import { makeTestPki, type TestPki } from "../support/certs.ts"
import { pollUntil } from "../support/poll.ts"
import { freePorts } from "../support/ports.ts"

const OVERLAY = path.join(import.meta.dirname, "..", "..", "examples", "k8s", "overlays", "example")
const ENV = { NODE_NAME: "gpu-node-1", NODE_IP: "10.0.0.9", CGN_AGENT_ADMIN_TOKEN: "t0ken" }

// biome-ignore lint/suspicious/noExplicitAny: manifests are untyped YAML; the assertions check the shape
type Doc = any

/** The overlay as `kubectl apply -k` would send it (kubectl's built-in kustomize: no cluster needed). */
const render = (): Array<Doc> => {
  const text = execFileSync("kubectl", ["kustomize", OVERLAY], { encoding: "utf8" })
  const docs = parseAllDocuments(text)
  for (const d of docs) expect(d.errors, d.errors.join("; ")).toEqual([])
  return docs.map((d) => d.toJS())
}

const decode = (toml: string): AgentConfig => {
  const r = decodeConfig(toml, "configmap.yaml:agent.toml", ENV)
  if (Result.isFailure(r)) throw new Error(r.failure.message)
  return r.success
}

const port = (hostPort: string): number => Number(splitHostPort(hostPort).port)

describe("examples/k8s (kustomize overlay)", () => {
  const docs = render()
  const find = (kind: string): Doc => {
    const d = docs.find((x) => x.kind === kind)
    expect(d, `${kind} rendered`).toBeDefined()
    return d
  }
  const configMap = find("ConfigMap")
  const daemonSet = find("DaemonSet")
  const podMonitor = find("PodMonitor")
  const toml: string = configMap.data["agent.toml"]
  const config = decode(toml)
  const pod = daemonSet.spec.template.spec
  const agent = pod.containers.find((c: Doc) => c.name === "agent")

  it("renders every resource into the overlay's namespace with the overlay's image", () => {
    for (const d of docs.filter((x) => x.kind !== "Namespace")) expect(d.metadata.namespace).toBe("cgn")
    const images = [...pod.initContainers, ...pod.containers].map((c: Doc) => c.image)
    for (const image of images) expect(image).toMatch(/^registry\.example\.com\/cgn\/cgn-agent:\S+$/)
  })

  it("ships a config that passes `check` (with the admin token the DaemonSet passes from its Secret)", async () => {
    expect(config.agent.node_id).toBe("gpu-node-1")
    const envNames = agent.env.map((e: Doc) => e.name)
    expect(envNames).toContain("CGN_AGENT_ADMIN_TOKEN")
    // the engine's key from an optional Secret: a cluster without it runs without one
    expect(agent.env.find((e: Doc) => e.name === "CGN_AGENT_ENGINE_API_KEY")?.valueFrom).toEqual({
      secretKeyRef: { name: "cgn-engine-api-key", key: "key", optional: true }
    })
    await Effect.runPromise(preflight(config, { offline: true }))
  })

  it("probes the plaintext health listener, since the kubelet cannot do mTLS", () => {
    expect(config.security.require_mtls).toBe(true)
    expect(config.agent.listen_health).toBeDefined()
    const healthPort = port(config.agent.listen_health ?? "")
    expect(healthPort).not.toBe(port(config.agent.listen_grpc))
    expect(agent.startupProbe.grpc.port).toBe(healthPort)
    expect(agent.readinessProbe.grpc.port).toBe(healthPort)
    expect(agent.livenessProbe.httpGet).toEqual({ path: "/healthz", port: port(config.agent.listen_admin) })
    const ports = Object.fromEntries(agent.ports.map((p: Doc) => [p.name, p.containerPort]))
    expect(ports).toEqual({
      grpc: port(config.agent.listen_grpc),
      health: healthPort,
      admin: port(config.agent.listen_admin)
    })
    // the startup budget outlasts the agent's own load and its own retry of it, each wait at its bound (the sum in
    // daemonset.yaml's header): the agent is the clock of a load, a kubelet kill would start it over
    const startupS = agent.startupProbe.failureThreshold * agent.startupProbe.periodSeconds
    const s = (d: Duration.Duration) => Duration.toSeconds(d)
    const { startup_timeout, stop_grace, gpu_free_timeout, restart_backoff_initial } = config.engine
    const lockTakeoverS = 15
    const agentsOwnS =
      lockTakeoverS +
      s(stop_grace) +
      s(gpu_free_timeout) +
      (s(startup_timeout) + s(stop_grace)) +
      (s(restart_backoff_initial) + s(gpu_free_timeout)) +
      s(startup_timeout)
    expect(startupS).toBeGreaterThanOrEqual(agentsOwnS)
    // SIGKILL must not cut the ordered drain short, not even with every peer hung: the grace period covers the
    // shutdown's worst case for this config and the container's environment (OTEL_* decide the trace flush).
    const containerEnv = Object.fromEntries(
      agent.env.filter((e: Doc) => typeof e.value === "string").map((e: Doc) => [e.name, e.value])
    )
    const boundS = Duration.toSeconds(shutdownBound(config, containerEnv))
    expect(boundS).toBeGreaterThan(
      Duration.toSeconds(config.agent.drain_timeout) + Duration.toSeconds(config.engine.stop_grace)
    )
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(Math.ceil(boundS))
  })

  it("agrees with the config on GPUs, node identity, files and state", () => {
    // the engine takes tp x dp GPUs (layers/engine/backends/index.ts planFor); extended resources: requests = limits
    expect(agent.resources.limits["nvidia.com/gpu"]).toBe(config.model.tp * config.model.dp)
    expect(agent.resources.requests["nvidia.com/gpu"]).toBe(config.model.tp * config.model.dp)
    expect(pod.tolerations).toContainEqual({ key: "nvidia.com/gpu", operator: "Exists", effect: "NoSchedule" })
    expect(Object.keys(pod.nodeSelector)).toContain("nvidia.com/gpu.present")
    const env = Object.fromEntries(agent.env.map((e: Doc) => [e.name, e.valueFrom]))
    expect(env.NODE_NAME).toEqual({ fieldRef: { fieldPath: "spec.nodeName" } })
    expect(env.NODE_IP).toEqual({ fieldRef: { fieldPath: "status.hostIP" } })
    // One ConfigMap for every node: each engine's NIXL side channel listens on, and is advertised as, its own
    // node's address (host networking), not the engine's loopback.
    expect(pod.hostNetwork).toBe(true)
    expect(engineFor(config.engine.kind).render(config).env.VLLM_NIXL_SIDE_CHANNEL_HOST).toBe(ENV.NODE_IP)
    const mounts: Array<string> = agent.volumeMounts.map((m: Doc) => m.mountPath)
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

  it("runs under RuntimeDefault seccomp, with every engine cache on the writable cache volume", () => {
    expect(pod.securityContext.seccompProfile).toEqual({ type: "RuntimeDefault" })
    expect(pod.securityContext.runAsNonRoot).toBe(true)
    const cacheMount = agent.volumeMounts.find((m: Doc) => m.name === "cache")
    const cacheVolume = pod.volumes.find((v: Doc) => v.name === "cache")
    expect(cacheVolume.hostPath.type).toBe("DirectoryOrCreate")
    const env = Object.fromEntries(agent.env.map((e: Doc) => [e.name, e.value]))
    for (const name of ["HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"])
      expect(env[name], name).toMatch(new RegExp(`^${cacheMount.mountPath}/`))
    // the user has no passwd entry: Python's getpass.getuser() needs a name from the environment
    expect(env.USER).toMatch(/^[a-z][a-z0-9-]*$/)
    // state_dir on the host too: a cordon and a GPU's remembered Xids outlive the pod (a rollout)
    const stateMount = agent.volumeMounts.find((m: Doc) => m.name === "state")
    const stateVolume = pod.volumes.find((v: Doc) => v.name === "state")
    expect(stateVolume.hostPath.type).toBe("DirectoryOrCreate")
    // kubelet creates the hostPaths root-owned: the init container hands them to the agent's user
    const init = pod.initContainers.find((c: Doc) => c.name === "cache-owner")
    const owner = `${pod.securityContext.runAsUser}:${pod.securityContext.runAsGroup}`
    expect(init.command.slice(0, 2)).toEqual(["sh", "-c"])
    expect(init.command[2]).toContain(`chown ${owner} ${cacheMount.mountPath} `)
    expect(init.command[2]).toMatch(new RegExp(`chown ${owner} .*${stateMount.mountPath}$`))
    expect(init.volumeMounts.map((m: Doc) => m.mountPath).sort()).toEqual(
      [cacheMount.mountPath, stateMount.mountPath].sort()
    )
    expect(init.securityContext.capabilities).toEqual({ drop: ["ALL"], add: ["CHOWN"] })
  })

  it("ships a PodMonitor that selects the agent pods and scrapes the admin port", () => {
    expect(podMonitor.apiVersion).toBe("monitoring.coreos.com/v1")
    expect(daemonSet.spec.template.metadata.labels).toMatchObject(podMonitor.spec.selector.matchLabels)
    const [endpoint] = podMonitor.spec.podMetricsEndpoints
    expect(endpoint).toMatchObject({ port: "admin", path: "/metrics" })
    expect(agent.ports.map((p: Doc) => p.name)).toContain(endpoint.port)
  })
})

describe("the shipped config, probed the way the kubelet probes it", () => {
  let pki: TestPki

  beforeAll(() => {
    pki = makeTestPki()
  })
  afterAll(async () => {
    await killAllAgents()
    pki?.cleanup()
  })

  it("the DaemonSet's readiness probe (plaintext grpc.health.v1 Check) sees SERVING once the engine is up", async () => {
    const docs = render()
    const configMap = docs.find((d) => d.kind === "ConfigMap")
    const pod = docs.find((d) => d.kind === "DaemonSet").spec.template.spec
    const agentSpec = pod.containers.find((c: Doc) => c.name === "agent")
    const shipped = parseToml(configMap.data["agent.toml"]) as Doc

    // The shipped file with only paths, ports and hosts rewritten for this machine (no GPU, no etcd, test PKI).
    const [grpcPort, healthPort, adminPort, enginePort, etcdPort] = (await freePorts(5)) as Array<number>
    const portMap = new Map<number, number>([
      [port(shipped.agent.listen_grpc), grpcPort!],
      [port(shipped.agent.listen_health), healthPort!],
      [port(shipped.agent.listen_admin), adminPort!]
    ])
    const config = structuredClone(shipped)
    Object.assign(config.security, {
      ca_file: pki.ca.certFile,
      cert_file: pki.server.certFile,
      key_file: pki.server.keyFile
    })
    Object.assign(config.cluster, {
      // nothing listens there: registration retries in the background, which readiness does not wait for
      etcd: [`https://127.0.0.1:${etcdPort}`],
      etcd_ca_file: pki.ca.certFile,
      etcd_cert_file: pki.client.certFile,
      etcd_key_file: pki.client.keyFile
    })
    Object.assign(config.agent, {
      listen_grpc: `127.0.0.1:${grpcPort}`,
      listen_health: `127.0.0.1:${healthPort}`,
      listen_admin: `127.0.0.1:${adminPort}`,
      state_dir: "state"
    })
    Object.assign(config.engine, {
      url: `http://127.0.0.1:${enginePort}`,
      command: [process.execPath, simDistEntry, "--flavor", "vllm"],
      startup_timeout: "30s",
      stop_grace: "2s"
    })
    // `check` (the same preflight `run` makes) passes on it
    await Effect.runPromise(preflight(decode(stringifyToml(config))))

    const agent = await startAgent({
      config: stringifyToml(config),
      env: { ...ENV, NODE_IP: "127.0.0.1" },
      awaitReady: false
    })
    const probePort = portMap.get(agentSpec.readinessProbe.grpc.port)
    expect(probePort, "the readiness probe's port is one the agent listens on").toBeDefined()
    expect(agentSpec.startupProbe.grpc).toEqual(agentSpec.readinessProbe.grpc)

    // kubelet: insecure channel, Check{service: probe.grpc.service ?? ""}
    const channel = createChannel(`127.0.0.1:${probePort}`)
    const health = createClient(HealthDefinition, channel)
    const service = agentSpec.readinessProbe.grpc.service ?? ""
    try {
      const status = await pollUntil(
        "SERVING on the probe port",
        async () => {
          const r = await health.check({ service }, { signal: AbortSignal.timeout(2_000) })
          return r.status === HealthCheckResponse_ServingStatus.SERVING ? r.status : undefined
        },
        30_000
      ).catch((e: Error) => {
        throw new Error(`${e.message}\n${agent.tail()}`)
      })
      expect(status).toBe(HealthCheckResponse_ServingStatus.SERVING)

      // the mTLS listener still refuses plaintext (why the probe cannot use it)
      const mtls = createChannel(`127.0.0.1:${grpcPort}`)
      await expect(
        createClient(HealthDefinition, mtls).check({ service: "" }, { signal: AbortSignal.timeout(5_000) })
      ).rejects.toThrow()
      mtls.close()

      // a drain turns the probe NOT_SERVING at once: a Watch opened while SERVING sees it before the agent exits
      // (a Check polled after SIGTERM could not tell NOT_SERVING from a listener already closed).
      const watch = health.watch({ service }, { signal: AbortSignal.timeout(20_000) })[Symbol.asyncIterator]()
      expect((await watch.next()).value?.status).toBe(HealthCheckResponse_ServingStatus.SERVING)
      agent.stop("SIGTERM").catch(() => undefined)
      const next = await watch.next()
      expect(next.done ? "the Watch ended" : next.value.status, agent.tail()).toBe(
        HealthCheckResponse_ServingStatus.NOT_SERVING
      )
      expect((await agent.exited).code).toBe(0)
    } finally {
      channel.close()
    }
  }, 60_000)
})
