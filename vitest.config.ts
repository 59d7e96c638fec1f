import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Tests spawn real processes (simulator, etcd, the agent); forks isolate their handles.
    pool: "forks",
    testTimeout: 60_000,
    hookTimeout: 60_000,
    maxWorkers: 2
  }
})
