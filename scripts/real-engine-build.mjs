#!/usr/bin/env node
// Builds llama.cpp's `llama-server` (CPU only) from the source that the npm package node-llama-cpp ships
// as a git bundle (package/llama/gitRelease.bundle), so the test suite can run the agent against a real
// engine. Nothing is fetched but that one tarball from the npm registry (`npm pack`, integrity-checked).
//
// The result is cached under $CGN_REAL_ENGINE_CACHE (default ~/.cache/cgn-agent/llama.cpp), one folder per
// llama.cpp tag and build flags: <cache>/<tag>-O0/bin/llama-server and <cache>/<tag>-O0/ggml-vocab-llama-spm.gguf (the tokenizer
// the test model copies). A second run finds them and returns in well under a second.
//
// One build at a time per cache folder: on a cold cache each real-engine test file run on its own (`vitest run
// test/real`) asks for the binary at once, as do two `npm test` side by side. A run that finds a build in progress
// waits for it and takes its result; if that build failed, it fails too (the first said why) rather than building
// again; if its process is gone (killed), it takes the build over.
//
// Prints the path of the cache folder as its last stdout line. Exits 1 with a clear reason when cmake or a
// C++ compiler is missing (never a silent skip: the real-engine suite depends on it).
import { execFileSync, spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { homedir } from "node:os"
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"

// node-llama-cpp 3.21.1 (pinned: newer releases may make `npm ci` refuse the lock here). Its llama.cpp tag
// is in package/llama/llama.cpp.info.json; the integrity is the registry's `dist.integrity`.
const PACKAGE = "node-llama-cpp@3.21.1"
const INTEGRITY = "sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg=="
const TAG = "v0.4.0"

// -O0, not Release's -O3: the tests run a 2-layer, 64-wide model, where kernel speed does not matter, and the
// compile is most of a cold `npm test` (on 2 cores: -O3 23.6 CPU-minutes, -O1 16.6 and 10 minutes, -O0 11.3 and 6;
// the real-engine files took 84 s at -O0 against 78 at -O1). Part of the cache key, with the tag.
const OPT = "-O0 -DNDEBUG"
const BUILD_ID = `${TAG}-O0`

const cacheRoot = process.env.CGN_REAL_ENGINE_CACHE ?? join(homedir(), ".cache", "cgn-agent", "llama.cpp")
const out = join(cacheRoot, BUILD_ID)
const server = join(out, "bin", "llama-server")
const vocab = join(out, "ggml-vocab-llama-spm.gguf")

const log = (line) => process.stderr.write(`real-engine: ${line}\n`)

const need = (cmd, args, what) => {
  const r = spawnSync(cmd, args, { encoding: "utf8" })
  if (r.error || r.status !== 0) {
    log(`${what} is required to build llama-server (\`${cmd}\` not found or not working).`)
    log("Install it (Debian: apt-get install -y cmake g++ git) and run `npm run real-engine:build` again.")
    process.exit(1)
  }
}

const cached = () => existsSync(server) && existsSync(vocab)
const useCached = () => {
  log(`cached: ${server}`)
  console.log(out)
  process.exit(0)
}
if (cached()) useCached()

need("cmake", ["--version"], "cmake")
need("c++", ["--version"], "a C++ compiler (g++)")
need("git", ["--version"], "git")

mkdirSync(cacheRoot, { recursive: true })
const lock = join(cacheRoot, `.${BUILD_ID}.lock`)
const workPrefix = `.${BUILD_ID}.work-`

const alive = (pid) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return e.code === "EPERM"
  }
}

/** The pid the lock names; undefined while its holder has created it but not yet written it. */
const lockHolder = () => {
  const text = readFileSync(lock, "utf8").trim()
  return text === "" ? undefined : Number(text)
}

// Returns once this run holds the lock. A run that waited for another's build exits instead, once that build has
// ended: with its result, or failing with it (a build whose process died is taken over, not waited for again).
const takeLock = async () => {
  let waitedFor = null // the holder's pid ("starting" before it wrote it), once this run has waited for it
  for (;;) {
    try {
      writeFileSync(lock, `${process.pid}\n`, { flag: "wx" })
    } catch (e) {
      if (e.code !== "EEXIST") throw e
      let pid
      try {
        pid = lockHolder()
      } catch (e2) {
        if (e2.code === "ENOENT") continue // released between our two looks
        throw e2
      }
      if (pid !== undefined && !alive(pid)) {
        log(`taking over from a build that is gone (pid ${pid}, ${lock})`)
        rmSync(lock, { force: true })
        waitedFor = null
        continue
      }
      if (waitedFor !== (pid ?? "starting"))
        log(`waiting for the build in progress (pid ${pid ?? "starting"}, ${lock})`)
      waitedFor = pid ?? "starting"
      await sleep(1000)
      continue
    }
    if (waitedFor === null) return
    // The build waited for released the lock: it ended.
    rmSync(lock, { force: true })
    if (cached()) useCached()
    log(`the build this waited for (pid ${waitedFor}) failed: its error is in the output of the run that started it;`)
    log("`npm run real-engine:build` builds again and says why")
    process.exit(1)
  }
}

await takeLock()
if (cached()) {
  // Built by a run that was stopped between its rename and its release of the lock.
  rmSync(lock, { force: true })
  useCached()
}
const started = Date.now()
// A build killed half-way leaves its folder: removed here, under the lock.
for (const f of readdirSync(cacheRoot)) {
  if (f.startsWith(workPrefix) && !alive(Number(f.slice(workPrefix.length)))) {
    rmSync(join(cacheRoot, f), { recursive: true, force: true })
  }
}
const work = join(cacheRoot, `${workPrefix}${process.pid}`)
mkdirSync(work)
try {
  log(`fetching ${PACKAGE} from the npm registry`)
  const packed = execFileSync("npm", ["pack", PACKAGE, "--silent", "--pack-destination", work], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"]
  })
    .trim()
    .split("\n")
    .pop()
  const tgz = join(work, packed)
  const [algo, expected] = INTEGRITY.split("-", 2)
  const actual = createHash(algo).update(readFileSync(tgz)).digest("base64")
  if (actual !== expected) throw new Error(`${PACKAGE}: integrity mismatch (${actual} != ${expected})`)

  execFileSync("tar", ["xzf", tgz, "-C", work, "package/llama/gitRelease.bundle", "package/llama/llama.cpp.info.json"])
  const info = JSON.parse(readFileSync(join(work, "package/llama/llama.cpp.info.json"), "utf8"))
  if (info.tag !== TAG) throw new Error(`${PACKAGE} ships llama.cpp ${info.tag}, this script expects ${TAG}`)

  const src = join(work, "llama.cpp")
  execFileSync("git", ["clone", "--quiet", join(work, "package/llama/gitRelease.bundle"), src], {
    stdio: ["ignore", "ignore", "inherit"]
  })

  const build = join(work, "build")
  const jobs = String(
    Math.max(1, Number(process.env.CGN_BUILD_JOBS ?? 0) || (globalThis.navigator?.hardwareConcurrency ?? 2))
  )
  log(`configuring llama.cpp ${TAG} (CPU, llama-server only)`)
  execFileSync(
    "cmake",
    [
      "-S",
      src,
      "-B",
      build,
      "-DCMAKE_BUILD_TYPE=Release",
      `-DCMAKE_C_FLAGS_RELEASE=${OPT}`,
      `-DCMAKE_CXX_FLAGS_RELEASE=${OPT}`,
      "-DBUILD_SHARED_LIBS=OFF",
      "-DGGML_NATIVE=OFF", // the cache may move between machines of one kind; no -march=native
      "-DLLAMA_CURL=OFF",
      "-DLLAMA_OPENSSL=OFF",
      "-DLLAMA_BUILD_TESTS=OFF",
      "-DLLAMA_BUILD_EXAMPLES=OFF",
      "-DLLAMA_BUILD_UI=OFF",
      "-DLLAMA_USE_PREBUILT_UI=OFF", // ON would download the web UI at configure time
      "-DLLAMA_BUILD_SERVER=ON",
      "-DLLAMA_BUILD_TOOLS=ON"
    ],
    { stdio: ["ignore", "ignore", "inherit"] }
  )
  log(
    `building llama-server with ${jobs} jobs (a cold build took 6 minutes on 2 cores, 11.3 CPU-minutes; longer on a busy machine)`
  )
  execFileSync("cmake", ["--build", build, "--target", "llama-server", "-j", jobs], {
    stdio: ["ignore", "ignore", "inherit"]
  })

  // Assemble in a temp folder and rename, so a build killed half-way never looks cached.
  const staging = mkdtempSync(join(cacheRoot, `.${BUILD_ID}-`))
  mkdirSync(join(staging, "bin"))
  cpSync(join(build, "bin", "llama-server"), join(staging, "bin", "llama-server"))
  cpSync(join(src, "models", "ggml-vocab-llama-spm.gguf"), join(staging, "ggml-vocab-llama-spm.gguf"))
  writeFileSync(join(staging, "info.json"), `${JSON.stringify({ package: PACKAGE, tag: TAG, flags: OPT }, null, 2)}\n`)
  rmSync(out, { recursive: true, force: true })
  renameSync(staging, out)
  log(`built in ${((Date.now() - started) / 1000).toFixed(0)} s: ${server}`)
  console.log(out)
} finally {
  rmSync(work, { recursive: true, force: true })
  rmSync(lock, { force: true })
}
