/**
 * `cgn-agent check --config F`: validates the file and prints a short summary of what would run.
 * A bad file fails with its ConfigError (cli.ts prints it and exits 2); nothing is started.
 */
import { Console, Effect } from "effect"
import { Command } from "effect/cli"
import type { AgentConfig } from "../services/Config.ts"
import { configFlag, loadConfig } from "./configOption.ts"

/** The summary `check` prints: one `key: value` line per fact an operator checks first. */
export const summarize = (c: AgentConfig): string => {
  const m = c.model
  const lines: Array<[string, string]> = [
    ["engine", `${c.engine.kind} at ${c.engine.url}`],
    ["model", `${m.name} (${m.source.kind} ${m.source.value}), served as ${m.served_name}`],
    ["tp", String(m.tp)],
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
  Effect.flatMap(loadConfig(config), (c) => Console.log(summarize(c)))
).pipe(
  Command.withDescription("Validate a config file and print a short summary (exit 2 with one line per problem)"),
  Command.withExamples([
    { command: "cgn-agent check --config examples/prod.toml", description: "Validate the production example" }
  ])
)
