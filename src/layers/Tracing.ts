/**
 * Tracing: spans exported over OTLP/HTTP when `[agent].otlp_endpoint` is set, through
 * @effect/opentelemetry's Node SDK; nothing (Effect's no-op tracer) otherwise. Spans are flushed
 * when the layer's scope closes, at the end of shutdown.
 */
import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Layer } from "effect"
import type { AgentConfig } from "../services/Config.ts"
import { packageVersion } from "./NodeStatus.ts"

/** The OTLP trace exporter for the configured endpoint, or no layer at all. */
export const layer = (config: AgentConfig): Layer.Layer<never> => {
  const endpoint = config.agent.otlp_endpoint
  if (endpoint === undefined) return Layer.empty
  return NodeSdk.layer(() => ({
    resource: {
      serviceName: "cgn-agent",
      serviceVersion: packageVersion(),
      attributes: { "service.instance.id": config.agent.node_id, "cgn.cluster": config.cluster.name }
    },
    spanProcessor: new BatchSpanProcessor(new OTLPTraceExporter({ url: `${endpoint.replace(/\/$/, "")}/v1/traces` }))
  }))
}
