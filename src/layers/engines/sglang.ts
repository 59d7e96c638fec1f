// PLACEHOLDER: capabilities only; render is written in the renderer change.
import type { Engine } from "../../services/Engine.ts"

export const sglang: Engine = {
  kind: "sglang",
  capabilities: {
    spawns: true,
    kvOffloads: ["none", "hicache", "lmcache", "nixl"],
    roles: ["prefill", "decode", "both"],
    kvEvents: true,
    tensorParallel: true,
    sources: ["hf_repo", "path"]
  },
  render: () => {
    throw new Error("render not written yet")
  }
}
