// REVIEW27 scratch: connections reset before their accept share one key (remoteAddress undefined). (delete me)
import { spawn } from "node:child_process"
import { expect, it } from "vitest"
import type { GuardEvent } from "../../src/layers/grpc/http2/Guard.ts"
import { Http2GrpcServer } from "../../src/layers/grpc/http2/Server.ts"

it("counts stay after connections reset before accept", async () => {
  const events: Array<GuardEvent> = []
  const server = new Http2GrpcServer({ maxReceiveMessageLength: 1 << 20, maxConnections: 8, onGuard: (e) => events.push(e) })
  const port = await server.listen("127.0.0.1", 0)
  try {
    for (let round = 0; round < 5; round++) {
      const child = spawn(process.execPath, ["-e", `
        const net = require("node:net"); let n = 0
        for (let i = 0; i < 5; i++) { const c = net.connect(${port}, "127.0.0.1", () => { c.resetAndDestroy(); if (++n === 5) setTimeout(() => process.exit(0), 50) }); c.on("error", () => {}) }
      `], { stdio: "inherit" })
      const exited = new Promise((r) => child.on("exit", r))
      // The agent's loop busy (relaying tokens) while the client connects and resets.
      const t = Date.now()
      while (Date.now() - t < 700) {}
      await exited
      await new Promise((r) => setTimeout(r, 200))
      console.log(`round ${round}: server.connections=${server.connections} sessions=${server.open.sessions}`)
    }
    const net = await import("node:net")
    const legit = net.connect(port, "127.0.0.1")
    legit.on("error", () => {})
    await new Promise((r) => legit.once("close", r))
    console.log("after legit connect:", events.filter((e) => e.kind === "refused"))
    expect(server.connections).toBe(0)
  } finally {
    server.destroy()
  }
}, 20_000)
