// PLACEHOLDER: capabilities only; render is written in the renderer change.
import type { Engine } from "../../services/Engine.ts"

export const vllm: Engine = {
  kind: "vllm",
  capabilities: {
    spawns: true,
    kvOffloads: ["none", "nixl", "lmcache", "kvbm"],
    roles: ["prefill", "decode", "both"],
    kvEvents: true,
    tensorParallel: true,
    sources: ["hf_repo", "path"]
  },
  render: () => {
    throw new Error("render not written yet")
  }
}
