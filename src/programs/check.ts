/**
 * `cgn-agent check --config F`: validates the file and prints a short summary of what would run.
 * A bad file fails with its ConfigError (cli.ts prints it and exits 2); nothing is started.
 */
import { Console, Effect } from "effect"
import { Command } from "effect/cli"
import { resolvePlan } from "../layers/engines/index.ts"
import type { AgentConfig } from "../services/Config.ts"
import { configFlag, loadConfig } from "./configOption.ts"

/** The summary `check` prints: one `key: value` line per fact an operator checks first. */
export const summarize = (c: AgentConfig): string => {
  const m = c.model
  const lines: Array<[string, string]> = [
    ["engine", `${c.engine.kind} at ${c.engine.url}`],
    ["model", `${m.name} (${m.source.kind} ${m.source.value}), served as ${m.served_name}`],
    ["tp", String(m.tp)],
    ["gpus", m.gpus.length > 0 ? m.gpus.join(", ") : "automatic (the first tp x dp healthy GPUs at start)"],
    ["role", c.agent.role],
    ["kv_offload", c.engine.kv_offload],
    ["kv events", c.kv.events ? `on, ${c.kv.events_endpoint}` : "off"],
    ["grpc", `${c.agent.listen_grpc}${c.security.require_mtls ? " (mTLS)" : ""}`],
    ["admin", c.agent.listen_admin],
    ["node id", c.agent.node_id],
    [
      "cluster",
      c.cluster.etcd.length > 0 ? `${c.cluster.name} via etcd ${c.cluster.etcd.join(", ")}` : "standalone (no etcd)"
    ]
  ]
  const width = Math.max(...lines.map(([k]) => k.length)) + 1
  return [`${c.file ?? "<inline>"}: ok`, ...lines.map(([k, v]) => `  ${`${k}:`.padEnd(width)} ${v}`)].join("\n")
}

export const check = Command.make("check", { config: configFlag }, ({ config }) =>
  // the plan too: with NVML on this host, a tp x dp it cannot hold (or a GPU it lacks) is refused here
  Effect.flatMap(loadConfig(config), (c) => Effect.andThen(resolvePlan(c), Console.log(summarize(c))))
).pipe(
  Command.withDescription("Validate a config file and print a short summary (exit 2 with one line per problem)"),
  Command.withExamples([
    { command: "cgn-agent check --config examples/prod.toml", description: "Validate the production example" }
  ])
)
