// PLACEHOLDER: capabilities only; render is written in the renderer change.
import type { Engine } from "../../services/Engine.ts"

export const openaiCompat: Engine = {
  kind: "openai_compat",
  capabilities: {
    spawns: false,
    kvOffloads: ["none"],
    roles: ["both"],
    kvEvents: false,
    tensorParallel: true,
    sources: ["hf_repo", "path"]
  },
  render: () => {
    throw new Error("render not written yet")
  }
}
