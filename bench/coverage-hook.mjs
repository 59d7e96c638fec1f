// Preloaded into the agent by bench/generate-path.ts (`node --import`): SIGUSR2 writes V8's coverage so far to
// NODE_V8_COVERAGE and resets the counters (node:v8 takeCoverage), so two signals bracket one window of work.
import v8 from "node:v8"

process.on("SIGUSR2", () => v8.takeCoverage())
