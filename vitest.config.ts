import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Tests spawn real processes (simulator, etcd, the agent); forks isolate their handles.
    pool: "forks",
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Three on the 2-core CI machine: the files mostly wait on the processes they spawn, and two workers kept the
    // cores 74% busy (README, Test prerequisites: three took the suite from 644 s to 537-627 s there)
    maxWorkers: 3
  }
})
