// The container packaging: base images pinned to exact versions (no `latest`, Node equal to the one the tests
// run on), OCI labels on both final images, and the trimmed production node_modules (`npm ci --omit=dev
// --omit=peer` + scripts/prune-prod.mjs, what the Dockerfile's deps stage does) still runs the agent.
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as fsp from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { promisify } from "node:util"
import { afterAll, describe, expect, it } from "vitest"
import { repoRoot, requireDist } from "../support/agent.ts"

const run = promisify(execFile)
const dockerfile = fs.readFileSync(path.join(repoRoot, "Dockerfile"), "utf8")
const pkg = JSON.parse(fs.readFileSync(path.join(repoRoot, "package.json"), "utf8"))

const args = Object.fromEntries([...dockerfile.matchAll(/^ARG ([A-Z_]+)=(\S+)$/gm)].map((m) => [m[1]!, m[2]!] as const))

/** The stages: name and the lines up to the next FROM. */
const stages = dockerfile
  .split(/^(?=FROM )/m)
  .filter((s) => s.startsWith("FROM "))
  .map((s) => ({ name: /AS (\S+)/.exec(s)?.[1] ?? "", text: s }))

describe("Dockerfile", () => {
  it("pins every base image to an exact version, Node to the tests' Node", () => {
    const froms = stages.map((s) => /^FROM (\S+)/.exec(s.text)![1]!)
    for (const from of froms) expect(from, "images come from the pinned ARGs").toMatch(/^\$\{[A-Z_]+_IMAGE\}$/)
    expect(args.NODE_IMAGE).toBe(`node:${pkg.devDependencies.node}-bookworm`)
    expect(args.NODE_SLIM_IMAGE).toBe(`node:${pkg.devDependencies.node}-bookworm-slim`)
    expect(args.VLLM_IMAGE).toMatch(/^vllm\/vllm-openai:v\d+\.\d+\.\d+$/)
    expect(dockerfile).not.toMatch(/:latest\b/)
  })

  it("runs the agent with the same Node flags in both final images, bounded young and old generations and one malloc arena among them", async () => {
    const entries = [...dockerfile.matchAll(/^ENTRYPOINT (\[.*\])$/gm)].map((m) => JSON.parse(m[1]!) as Array<string>)
    expect(entries).toHaveLength(2)
    expect(entries[0]).toEqual(entries[1])
    // The allocator setting is the agent process's own (`env` before `node`), not the image's (no ENV line).
    expect(entries[0]!.slice(0, 5)).toEqual(["/usr/bin/tini", "--", "/usr/bin/env", "MALLOC_ARENA_MAX=1", "node"])
    expect(dockerfile).not.toMatch(/^ENV MALLOC_/m)
    const flags = entries[0]!.slice(entries[0]!.indexOf("node") + 1, entries[0]!.indexOf("/opt/cgn-agent/dist/main.js"))
    expect(flags.some((f) => /^--max-semi-space-size=\d+$/.test(f))).toBe(true)
    expect(flags.some((f) => /^--heap-growing-percent=\d+$/.test(f))).toBe(true)
    // No inspector on a SIGUSR1: on hostNetwork its 127.0.0.1:9229 is the host's, open to the host's other processes.
    expect(flags).toContain("--disable-sigusr1")
    // --heap-growing-percent is a V8 flag: the pinned Node (the tests' own, by the test above) must still accept
    // it, which it shows by exiting 0 (an unknown flag exits 9, "bad option").
    await expect(run(process.execPath, [...flags, "-e", "0"])).resolves.toBeDefined()
  })

  it("labels both final images (OCI annotations) and copies the trimmed dependencies", () => {
    for (const name of ["vllm", "runtime"]) {
      const stage = stages.find((s) => s.name === name)!
      for (const label of ["title", "description", "licenses", "version", "revision", "created", "base.name"])
        expect(stage.text, `${name}: org.opencontainers.image.${label}`).toContain(`org.opencontainers.image.${label}=`)
      expect(stage.text).toContain("COPY --from=deps /src/node_modules ./node_modules")
    }
    const deps = stages.find((s) => s.name === "deps")!.text
    expect(deps).toContain("npm ci --omit=dev --omit=peer")
    expect(deps).toContain("node scripts/prune-prod.mjs node_modules")
  })
})

describe("the production node_modules", () => {
  let dir = ""
  afterAll(async () => {
    if (dir !== "") await fsp.rm(dir, { recursive: true, force: true })
  })

  it("installed and trimmed as the image does, is smaller and still runs the agent", async () => {
    requireDist()
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), "cgn-prod-"))
    for (const f of ["package.json", "package-lock.json"]) await fsp.copyFile(path.join(repoRoot, f), path.join(dir, f))
    const npm = (extra: ReadonlyArray<string>) =>
      run("npm", ["ci", "--omit=dev", ...extra, "--offline", "--ignore-scripts", "--no-audit", "--no-fund"], {
        cwd: dir,
        env: { ...process.env, npm_config_loglevel: "error" },
        timeout: 400_000
      })
    const size = async () => Number((await run("du", ["-sk", path.join(dir, "node_modules")])).stdout.split("\t")[0])

    await npm([])
    const plain = await size()
    await fsp.rm(path.join(dir, "node_modules"), { recursive: true, force: true })
    await npm(["--omit=peer"])
    await run(process.execPath, [path.join(repoRoot, "scripts/prune-prod.mjs"), path.join(dir, "node_modules")])
    const trimmed = await size()
    console.log(`production node_modules: ${plain} KiB plain, ${trimmed} KiB trimmed`)
    expect(fs.existsSync(path.join(dir, "node_modules/redis"))).toBe(false)
    expect(trimmed).toBeLessThan(plain * 0.8)

    // The agent on exactly these dependencies: every module of the CLI (the whole daemon) loads, and the
    // native addons load for this platform.
    // a copy, not a symlink: Node resolves packages from a module's real path
    await fsp.cp(path.join(repoRoot, "dist"), path.join(dir, "dist"), { recursive: true })
    const checked = await run(
      process.execPath,
      [path.join(dir, "dist/main.js"), "check", "--offline", "--config", path.join(repoRoot, "examples/prod.toml")],
      { cwd: dir, timeout: 60_000 }
    )
    expect(checked.stdout).toContain("examples/prod.toml: ok")
    const addons = await run(
      process.execPath,
      ["--input-type=module", "-e", 'await import("zeromq"); await import("koffi"); console.log("ok")'],
      { cwd: dir, timeout: 60_000 }
    )
    expect(addons.stdout.trim()).toBe("ok")
  }, 900_000)
})
