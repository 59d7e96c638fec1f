/**
 * mlx-lm: `mlx_lm.server --model M --host --port`, nothing else can be expressed.
 * Its /health is green before the model loads, so readiness is a real 1-token completion; it loads
 * whatever a request's `model` names, so requests are forwarded with the configured model string
 * (mlx_lm/server.py: `handle_health` answers at once, `ModelProvider.load` runs on the first request).
 */

import type { AgentConfig } from "../../../services/config/Config.ts"
import { LISTEN_FLAGS } from "../../../services/engine/AgentFlags.ts"
import type { Engine } from "../../../services/engine/Engine.ts"
import { assemble, listenOf } from "./common.ts"
import { commandLineHint } from "./hints.ts"
import { MLX_MARKS } from "./logMarks.ts"

export const mlx: Engine = {
  kind: "mlx",
  capabilities: {
    displayName: "mlx-lm",
    // mlx_lm/server.py's argparse: --host, --port
    agentFlags: [LISTEN_FLAGS],
    modelPath: "directory",
    spawns: true,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: false,
    sources: ["hf_repo", "path"],
    modelSettings: [],
    // mlx_lm/server.py `validate_model_parameters`: "top_k must be a non-negative integer"; 0 turns it off
    // (mlx_lm/sample_utils.py make_sampler applies top-k only when `top_k > 0`).
    requestDialect: { topKOff: 0 }
    // No servedContext: mlx-lm's /v1/models entries carry only id, object and created (mlx_lm/server.py
    // handle_models_request), and it has no other endpoint that says the context.
  },
  render: (config: AgentConfig) => {
    const listen = listenOf(config)
    const model = config.model.source.value
    return assemble(config, listen, {
      executable: ["mlx_lm.server"],
      args: ["--model", model, "--host", listen.host, "--port", String(listen.port)],
      probe:
        config.agent.ready_probe_url !== undefined
          ? { kind: "http", url: config.agent.ready_probe_url }
          : {
              kind: "completion",
              url: `${listen.baseUrl}/v1/completions`,
              body: { model, prompt: "ping", max_tokens: 1 }
            },
      metrics: undefined,
      requestModel: model,
      exitHints: [commandLineHint(config, mlx.capabilities.displayName)],
      logLevels: MLX_MARKS
    })
  }
}
