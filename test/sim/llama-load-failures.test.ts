// The llama_cpp flavor starts and stops as llama-server does (tools/server/server.cpp, ggml-org/llama.cpp; facts
// pinned against the real server in test/real/sim-differential-12.test.ts):
// - a `-m` file it cannot load (not there, no GGUF, a header or a data section cut short) ends it at start with the
//   loader's lines (ggml/src/gguf.cpp, src/llama-model-loader.h), twice under --fit's default, exit 1;
// - a port it cannot bind ends it with cpp-httplib's "couldn't bind" and exit 1 (tools/server/server-http.cpp);
// - a signal during the load kills it (its handler is set only after load_model);
// - the first SIGTERM with a stream open logs "cleaning up before exit...", closes the listener and stalls the
//   stream, the process living on until the client leaves (exit 0); a second signal is exit 1.
import { spawn, spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { writeGguf } from "../support/gguf.ts"
import { type SimHandle, simEntry, startSim } from "../support/sim.ts"
import { simGguf } from "../support/simModel.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "llama-load-"))
const started: Array<SimHandle> = []
afterAll(async () => {
  await Promise.all(started.map((s) => s.stop(200)))
  fs.rmSync(dir, { recursive: true, force: true })
})

/** A GGUF model of two F32 tensors (4 and 64 floats), its data section at the end. */
const whole = writeGguf(new Map(), [
  { name: "a.weight", dims: [4], data: new Float32Array(4) },
  { name: "b.weight", dims: [8, 8], data: new Float32Array(64) }
])
const file = (name: string, data: Uint8Array | string): string => {
  const f = path.join(dir, name)
  fs.writeFileSync(f, data)
  return f
}

/** llama-server's own lines (not the simulator's JSON log), without their elapsed-time prefix. */
const engineLines = (stderr: string): Array<string> =>
  stderr
    .split("\n")
    .filter((l) => l !== "" && !l.startsWith("{"))
    .map((l) => l.replace(/^\d+\.\d\d\.\d{3}\.\d{3} /, ""))

/** The simulator run to its exit on `args` (a free port unless given). */
const run = (args: ReadonlyArray<string>) => {
  const p = spawnSync(process.execPath, [simEntry, "--flavor", "llama_cpp", "--port", "0", ...args], {
    encoding: "utf8",
    timeout: 20_000
  })
  return { code: p.status, signal: p.signal, lines: engineLines(p.stderr) }
}

const loadFailure = (model: string, cause: ReadonlyArray<string>, fit = true): Array<string> => {
  const attempt = [...cause, "E llama_model_load_from_file_impl: failed to load model"]
  const fitPass = [
    ...attempt,
    "E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model"
  ]
  return [
    `I srv    load_model: loading model '${model}'`,
    ...(fit ? fitPass : []),
    ...attempt,
    `E cmn  common_init_: failed to load model '${model}'`,
    `E srv    load_model: failed to load model, '${model}'`,
    "I srv    operator(): operator(): cleaning up before exit...",
    "E srv  llama_server: exiting due to model loading error"
  ]
}
const notLoaded = (model: string) =>
  `E llama_model_load: error loading model: llama_model_loader: failed to load model from ${model}`
const outOfBounds = (tensor: string) =>
  `E llama_model_load: error loading model: tensor '${tensor}' data is not within the file bounds, model is corrupted or incomplete`

describe("a -m file llama-server cannot load ends the llama_cpp flavor at start, in the loader's words, exit 1", () => {
  it.each<[string, () => string, (m: string) => ReadonlyArray<string>]>([
    [
      "a missing file",
      () => path.join(dir, "absent.gguf"),
      (m) => [`E gguf_init_from_file: failed to open GGUF file '${m}' (No such file or directory)`, notLoaded(m)]
    ],
    [
      "a file that is no GGUF",
      () => file("text.gguf", "this is not a model\n"),
      (m) => ["E gguf_init_from_reader: invalid magic characters: 'this', expected 'GGUF'", notLoaded(m)]
    ],
    [
      "a file shorter than the magic",
      () => file("short.gguf", "GG"),
      (m) => ["E gguf_init_from_reader: failed to read magic", notLoaded(m)]
    ],
    [
      "a header cut short",
      () => file("header.gguf", whole.subarray(0, 12)),
      (m) => ["E gguf_init_from_reader: failed to read header", notLoaded(m)]
    ],
    [
      "tensor infos cut short",
      () => file("infos.gguf", whole.subarray(0, 40)),
      (m) => ["E gguf_init_from_reader: failed to read tensor info", notLoaded(m)]
    ],
    [
      "the last tensor's data cut short",
      () => file("last.gguf", whole.subarray(0, whole.length - 1)),
      () => [outOfBounds("b.weight")]
    ],
    [
      "every tensor's data cut short (the first in the file is named)",
      () => file("all.gguf", whole.subarray(0, whole.length - 280)),
      () => [outOfBounds("a.weight")]
    ]
  ])("%s", (_what, make, cause) => {
    const model = make()
    const r = run(["-m", model])
    expect({ code: r.code, signal: r.signal, lines: r.lines }).toEqual({
      code: 1,
      signal: null,
      lines: loadFailure(model, cause(model))
    })
  })

  it("--fit off: one attempt (common_fit_params' load is --fit's)", () => {
    const model = file("text2.gguf", "this is not a model\n")
    const cause = ["E gguf_init_from_reader: invalid magic characters: 'this', expected 'GGUF'", notLoaded(model)]
    expect(run(["-m", model, "--fit", "off"]).lines).toEqual(loadFailure(model, cause, false))
    expect(run(["-m", model, "-fit", "on"]).lines).toEqual(loadFailure(model, cause, true))
  })

  it("a whole file loads; --sim-crash-at-start model-file still dies of a missing file on a whole one", async () => {
    const model = file("whole.gguf", whole)
    const s = await startSim({ flavor: "llama_cpp", args: ["-m", model] })
    started.push(s)
    expect((await fetch(`${s.url}/health`)).status).toBe(200)
    const r = run(["-m", model, "--sim-crash-at-start", "model-file"])
    expect(r.code).toBe(1)
    expect(r.lines).toContain(`E gguf_init_from_file: failed to open GGUF file '${model}' (No such file or directory)`)
  })
})

describe("the llama_cpp flavor's port, signals and streams as llama-server's", () => {
  it("a port it cannot bind: cpp-httplib's line, then clean_up's, exit 1", async () => {
    const holder = net.createServer()
    await new Promise<void>((r) => holder.listen(0, "127.0.0.1", r))
    const port = (holder.address() as net.AddressInfo).port
    try {
      const r = run(["-m", simGguf(), "--host", "127.0.0.1", "--port", String(port)])
      expect({ code: r.code, lines: r.lines }).toEqual({
        code: 1,
        lines: [
          `E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: ${port}`,
          "I srv    operator(): operator(): cleaning up before exit...",
          "E srv  llama_server: exiting due to HTTP server error"
        ]
      })
    } finally {
      holder.close()
    }
  })

  it.each(["SIGTERM", "SIGINT"] as const)("%s while the model loads kills it (no handler yet)", async (signal) => {
    const s = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf(), "--sim-startup-delay", "60s"] })
    started.push(s)
    expect((await fetch(`${s.url}/health`)).status).toBe(503)
    process.kill(s.pid, signal)
    expect(await s.exited).toEqual({ code: null, signal })
  })

  it("SIGTERM with a stream open: clean_up's line, the listener closed, the stream stalled, alive until the client leaves", async () => {
    const s = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf(), "--sim-itl", "5ms"] })
    started.push(s)
    const ac = new AbortController()
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: "a b", max_tokens: 100_000, stream: true }),
      signal: ac.signal
    })
    const reader = res.body!.getReader()
    await reader.read()
    process.kill(s.pid, "SIGTERM")
    await s.waitForLine((l) => l.includes("cleaning up before exit..."))
    await expect(fetch(`${s.url}/health`)).rejects.toThrow()
    expect(s.proc.exitCode).toBeNull()
    ac.abort()
    expect(await s.exited).toEqual({ code: 0, signal: null })
  })

  it("a second SIGTERM while a stream holds it: exit 1 with the engine's line", async () => {
    const s = await startSim({ flavor: "llama_cpp", args: ["-m", simGguf(), "--sim-itl", "5ms"] })
    started.push(s)
    const client = spawn(
      process.execPath,
      [
        "-e",
        `fetch(${JSON.stringify(`${s.url}/v1/completions`)},{method:"POST",body:JSON.stringify({prompt:"a",max_tokens:100000,stream:true})}).then(async r=>{for await (const c of r.body){process.stdout.write("x")}})`
      ],
      { stdio: ["ignore", "pipe", "ignore"] }
    )
    try {
      await new Promise((r) => client.stdout.once("data", r))
      process.kill(s.pid, "SIGTERM")
      await s.waitForLine((l) => l.includes("cleaning up before exit..."))
      process.kill(s.pid, "SIGTERM")
      expect(await s.exited).toEqual({ code: 1, signal: null })
      expect(s.stderrLines.some((l) => l.includes("Received second interrupt, terminating immediately."))).toBe(true)
    } finally {
      client.kill("SIGKILL")
    }
  })
})
