// PLACEHOLDER: capabilities only; render is written in the renderer change.
import type { Engine } from "../../services/Engine.ts"

export const mlx: Engine = {
  kind: "mlx",
  capabilities: {
    spawns: true,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: false,
    sources: ["hf_repo", "path"]
  },
  render: () => {
    throw new Error("render not written yet")
  }
}
