#!/usr/bin/env node
// Builds llama.cpp's `llama-server` (CPU only) from the source that the npm package node-llama-cpp ships
// as a git bundle (package/llama/gitRelease.bundle), so the test suite can run the agent against a real
// engine. Nothing is fetched but that one tarball from the npm registry (`npm pack`, integrity-checked).
//
// The result is cached under $CGN_REAL_ENGINE_CACHE (default ~/.cache/cgn-agent/llama.cpp), one folder per
// llama.cpp tag and build flags: <cache>/<tag>-O1/bin/llama-server and <cache>/<tag>-O1/ggml-vocab-llama-spm.gguf (the tokenizer
// the test model copies). A second run finds them and returns in well under a second.
//
// Prints the path of the cache folder as its last stdout line. Exits 1 with a clear reason when cmake or a
// C++ compiler is missing (never a silent skip: the real-engine suite depends on it).
import { execFileSync, spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { homedir, tmpdir } from "node:os"
import { join } from "node:path"

// node-llama-cpp 3.21.1 (pinned: newer releases may make `npm ci` refuse the lock here). Its llama.cpp tag
// is in package/llama/llama.cpp.info.json; the integrity is the registry's `dist.integrity`.
const PACKAGE = "node-llama-cpp@3.21.1"
const INTEGRITY = "sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg=="
const TAG = "v0.4.0"

// -O1, not Release's -O3: the tests run a 2-layer, 64-wide model, where kernel speed does not matter and the
// compile time (most of `npm test` on a cold machine) roughly halves. Part of the cache key, with the tag.
const OPT = "-O1 -DNDEBUG"
const BUILD_ID = `${TAG}-O1`

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

if (existsSync(server) && existsSync(vocab)) {
  log(`cached: ${server}`)
  console.log(out)
  process.exit(0)
}

need("cmake", ["--version"], "cmake")
need("c++", ["--version"], "a C++ compiler (g++)")
need("git", ["--version"], "git")

const started = Date.now()
mkdirSync(cacheRoot, { recursive: true })
const work = mkdtempSync(join(tmpdir(), "cgn-llama-build-"))
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
    `building llama-server with ${jobs} jobs (a cold build took 10 minutes on 2 cores, 16.6 CPU-minutes at -O1; longer on a busy machine)`
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
}
