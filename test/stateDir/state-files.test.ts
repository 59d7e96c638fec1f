// Files in agent.state_dir (layers/stateDir/stateFiles.ts): the directory must be the agent's own (owner the agent's
// user or root, writable by its owner only; the directories above it too unless sticky), new files are created
// never through a link, mode 0600, and reads never follow a link. The security review (FINDINGS.md, item 3) had a
// 0777 state_dir accepted, planted links written through as root, and another file's bytes quoted in a warning.
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { pidFilePath, readPidFile, writePidFile } from "../../src/layers/engine/pidFile.ts"
import { cordonFilePath } from "../../src/layers/node/Cordon.ts"
import { writeDurably } from "../../src/layers/stateDir/durableFile.ts"
import { ensureStateDir } from "../../src/layers/stateDir/ensureStateDir.ts"
import {
  readNoFollow,
  socketDirDistrust,
  socketDistrust,
  stateDirDistrust,
  tempNameFor,
  writeNew
} from "../../src/layers/stateDir/stateFiles.ts"

const dirs: Array<string> = []
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true })
})
const tempDir = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-state-files-"))
  dirs.push(d)
  return d
}
const uid = process.getuid?.() ?? 0

describe("stateDirDistrust", () => {
  it("the agent's own directory (0700, or 0755) is trusted, and so is one still to be made in it or in /tmp", async () => {
    const dir = tempDir() // mkdtemp: 0700, under the sticky /tmp
    expect(await stateDirDistrust(dir, uid)).toBeUndefined()
    fs.chmodSync(dir, 0o755)
    expect(await stateDirDistrust(dir, uid)).toBeUndefined()
    expect(await stateDirDistrust(path.join(dir, "not", "yet"), uid)).toBeUndefined()
    expect(await stateDirDistrust(path.join(os.tmpdir(), `cgn-not-yet-${process.pid}`), uid)).toBeUndefined()
  })

  it("a directory writable by its group or others, or owned by another user, is refused, saying why", async () => {
    const dir = tempDir()
    fs.chmodSync(dir, 0o777)
    expect(await stateDirDistrust(dir, uid)).toBe(`${dir} is writable by its group and others (mode 0777)`)
    fs.chmodSync(dir, 0o702)
    expect(await stateDirDistrust(dir, uid)).toBe(`${dir} is writable by others (mode 0702)`)
    fs.chmodSync(dir, 0o770)
    expect(await stateDirDistrust(dir, uid)).toBe(`${dir} is writable by its group (mode 0770)`)
    // sticky does not make state_dir itself safe: anyone could still create the names the agent reads
    fs.chmodSync(dir, 0o1777)
    expect(await stateDirDistrust(dir, uid)).toMatch(/is writable by its group and others \(mode 01777\)/)
    fs.chmodSync(dir, 0o700)
    // owned by neither the agent's user nor root (as root: given away; else: seen by an agent of another uid)
    const [owner, agent] = uid === 0 ? [4242, 0] : [uid, uid + 4242]
    if (uid === 0) fs.chownSync(dir, owner, owner)
    expect(await stateDirDistrust(dir, agent)).toBe(
      `${dir} is owned by uid ${owner}, not by the agent's user (uid ${agent}) or root`
    )
  })

  it("a directory above it that others may write (not sticky) is refused: they could swap state_dir", async () => {
    const open = tempDir()
    const state = path.join(open, "state")
    fs.mkdirSync(state, { mode: 0o700 })
    fs.chmodSync(open, 0o777)
    expect(await stateDirDistrust(state, uid)).toBe(`${open} is writable by its group and others (mode 0777)`)
    // not made yet: it would be made in that directory
    expect(await stateDirDistrust(path.join(open, "other"), uid)).toBe(
      `${open} is writable by its group and others (mode 0777)`
    )
    fs.chmodSync(open, 0o1777)
    expect(await stateDirDistrust(state, uid)).toBeUndefined()
  })

  it("a symbolic link on the way is trusted only if the agent's user's or root's, where others cannot replace it", async () => {
    const base = tempDir()
    const real = path.join(base, "real")
    fs.mkdirSync(real, { mode: 0o700 })
    const open = path.join(base, "open")
    fs.mkdirSync(open)
    // the agent's own link in a sticky directory (/tmp's case): followed, the real directory judged
    fs.chmodSync(open, 0o1777)
    const link = path.join(open, "state")
    fs.symlinkSync(real, link)
    expect(await stateDirDistrust(link, uid)).toBeUndefined()
    expect(await stateDirDistrust(path.join(link, "not", "yet"), uid)).toBeUndefined()
    // the same link where anyone may replace it (not sticky): refused, whatever it points at
    fs.chmodSync(open, 0o777)
    expect(await stateDirDistrust(link, uid)).toBe(
      `${link} is a symbolic link others could replace: ${open} is writable by its group and others (mode 0777)`
    )
    expect(await socketDirDistrust(link, uid)).toMatch(/is a symbolic link others could replace/)
    // another user's link (one they made first where state_dir was still to be made): refused, it can be repointed
    fs.chmodSync(open, 0o1777)
    const [owner, agent] = uid === 0 ? [4242, 0] : [uid, uid + 4242]
    if (uid === 0) fs.lchownSync(link, owner, owner)
    const theirs = `${link} is a symbolic link owned by uid ${owner}, not by the agent's user (uid ${agent}) or root`
    expect(await stateDirDistrust(link, agent)).toBe(theirs)
    expect(await socketDirDistrust(link, agent)).toBe(theirs)
    const sock = path.join(real, "kvcached.sock")
    await listenAt(sock)
    expect(await socketDistrust(path.join(link, "kvcached.sock"), agent)).toBe(
      `${path.join(link, "kvcached.sock")} is in an untrusted directory: ${theirs}`
    )
  })

  it("a link is judged with every directory above it, and through the links its own target passes", async () => {
    const base = tempDir()
    const real = path.join(base, "real")
    fs.mkdirSync(real, { mode: 0o700 })
    // a relative link of the agent's own, in its own directory: followed
    const mine = path.join(base, "mine")
    fs.mkdirSync(mine, { mode: 0o755 })
    fs.symlinkSync("../real", path.join(mine, "state"))
    expect(await stateDirDistrust(path.join(mine, "state"), uid)).toBeUndefined()
    // its directory is fine, but one above it may be renamed by anyone (0777, not sticky): refused
    const open = path.join(base, "open")
    fs.mkdirSync(path.join(open, "inner"), { recursive: true, mode: 0o755 })
    fs.chmodSync(open, 0o777)
    fs.symlinkSync(real, path.join(open, "inner", "state"))
    expect(await stateDirDistrust(path.join(open, "inner", "state"), uid)).toBe(
      `${path.join(open, "inner", "state")} is a symbolic link others could replace: ${open} is writable by its group and others (mode 0777)`
    )
    // a loop is no finding here (the open fails apart)
    fs.symlinkSync(path.join(mine, "loop"), path.join(mine, "loop"))
    expect(await stateDirDistrust(path.join(mine, "loop"), uid)).toBeUndefined()
    // a trusted link whose target passes through a link another user may repoint: refused, naming that one (needs
    // root, to give a link away)
    if (uid !== 0) return
    const hop = path.join(base, "hop")
    fs.mkdirSync(hop, { mode: 0o1777 })
    fs.symlinkSync(real, path.join(hop, "theirs"))
    fs.lchownSync(path.join(hop, "theirs"), 4242, 4242)
    fs.symlinkSync(path.join(hop, "theirs"), path.join(mine, "via"))
    expect(await stateDirDistrust(path.join(mine, "via"), uid)).toBe(
      `${path.join(hop, "theirs")} is a symbolic link owned by uid 4242, not by the agent's user (uid 0) or root`
    )
  })
})

/** A Unix socket listening at `file` (closed after the test). */
const listenAt = async (file: string) => {
  const server = net.createServer()
  await new Promise<void>((resolve, reject) => server.once("error", reject).listen(file, resolve))
  servers.push(server)
}
const servers: Array<net.Server> = []
afterEach(async () => {
  for (const s of servers.splice(0)) await new Promise((resolve) => s.close(resolve))
})

describe("a state_dir with .. after a link", () => {
  it("is made where the agent's files go (.. taken as path.join takes it), not through the link", async () => {
    const base = tempDir()
    fs.mkdirSync(path.join(base, "other", "sub"), { recursive: true, mode: 0o700 })
    fs.symlinkSync(path.join(base, "other", "sub"), path.join(base, "lnk"))
    const stateDir = `${base}/lnk/../state`
    await Effect.runPromise(ensureStateDir(stateDir))
    expect(fs.statSync(path.join(base, "state")).isDirectory()).toBe(true)
    expect(fs.existsSync(path.join(base, "other", "state"))).toBe(false)
    expect(pidFilePath(stateDir)).toBe(path.join(base, "state", "engine.pid"))
  })
})

describe("socketDistrust (kv.uds: whoever listens there gets the KV events)", () => {
  it("a socket the agent's user made in its own directory is trusted, and in a sticky one (/tmp) too", async () => {
    const dir = tempDir() // 0700, under the sticky /tmp
    const sock = path.join(dir, "kvcached.sock")
    await listenAt(sock)
    expect(await socketDistrust(sock, uid)).toBeUndefined()
    fs.chmodSync(dir, 0o1777)
    expect(await socketDistrust(sock, uid)).toBeUndefined()
    expect(await socketDirDistrust(dir, uid)).toBeUndefined()
  })

  it("a link to it, a missing socket, a file, another user's socket and a 0777 directory are refused, saying why", async () => {
    const dir = tempDir()
    const sock = path.join(dir, "kvcached.sock")
    await listenAt(sock)
    const link = path.join(dir, "link.sock")
    fs.symlinkSync(sock, link)
    expect(await socketDistrust(link, uid)).toBe(`${link} is a symbolic link (not followed)`)
    expect(await socketDistrust(path.join(dir, "absent"), uid)).toBe(
      `${path.join(dir, "absent")} does not exist (ENOENT)`
    )
    fs.writeFileSync(path.join(dir, "file"), "")
    expect(await socketDistrust(path.join(dir, "file"), uid)).toBe(`${path.join(dir, "file")} is not a socket`)
    // owned by neither the agent's user nor root (as root: given away; else: seen by an agent of another uid)
    const [owner, agent] = uid === 0 ? [4242, 0] : [uid, uid + 4242]
    if (uid === 0) fs.lchownSync(sock, owner, owner)
    expect(await socketDistrust(sock, agent)).toBe(`${sock} is owned by uid ${owner}, not the agent's user or root`)
    if (uid === 0) fs.lchownSync(sock, 0, 0)
    // anyone may remove it and bind their own there: the directory is refused, and the socket with it
    fs.chmodSync(dir, 0o777)
    const why = `${dir} is writable by its group and others (mode 0777)`
    expect(await socketDistrust(sock, uid)).toBe(`${sock} is in an untrusted directory: ${why}`)
    expect(await socketDirDistrust(dir, uid)).toBe(why)
  })

  it("a directory above it that others may write (not sticky) is refused; a missing directory is no finding", async () => {
    const open = tempDir()
    const dir = path.join(open, "run")
    fs.mkdirSync(dir, { mode: 0o700 })
    const sock = path.join(dir, "kvcached.sock")
    await listenAt(sock)
    fs.chmodSync(open, 0o757)
    expect(await socketDistrust(sock, uid)).toBe(
      `${sock} is in an untrusted directory: ${open} is writable by others (mode 0757)`
    )
    expect(await socketDirDistrust(path.join(open, "not-yet"), uid)).toBeUndefined()
  })
})

describe("new files and reads in state_dir", () => {
  it("writeNew creates the file 0600 and never writes through a planted link", async () => {
    const dir = tempDir()
    const victim = path.join(dir, "victim.txt")
    fs.writeFileSync(victim, "precious")
    const file = path.join(dir, "engine.pid.tmp")
    fs.symlinkSync(victim, file)
    await expect(writeNew(file, "attacker's choice")).rejects.toThrow(/EEXIST/)
    expect(fs.readFileSync(victim, "utf8")).toBe("precious")
    const fresh = path.join(dir, "fresh")
    await writeNew(fresh, "x")
    expect(fs.statSync(fresh).mode & 0o777).toBe(0o600)
  })

  it("temp names are unpredictable; writeDurably leaves its record 0600 in a directory it made 0700", async () => {
    const a = tempNameFor("/s/cordon.json")
    expect(a).toMatch(new RegExp(`^/s/cordon\\.json\\.${process.pid}\\.[0-9a-f]{16}\\.tmp$`))
    expect(tempNameFor("/s/cordon.json")).not.toBe(a)
    const dir = path.join(tempDir(), "state")
    await writeDurably(path.join(dir, "cordon.json"), "{}")
    expect(fs.statSync(dir).mode & 0o777).toBe(0o700)
    expect(fs.statSync(path.join(dir, "cordon.json")).mode & 0o777).toBe(0o600)
  })

  it("readNoFollow refuses a link (naming it, quoting nothing of its target), a directory and an oversized file", async () => {
    const dir = tempDir()
    const secret = path.join(dir, "secret")
    fs.writeFileSync(secret, "TOPSECRET-content")
    const link = path.join(dir, "gpu-xids.json")
    fs.symlinkSync(secret, link)
    const err = await readNoFollow(link).catch((e: NodeJS.ErrnoException) => e)
    expect((err as NodeJS.ErrnoException).code).toBe("ELOOP")
    expect(String(err)).toContain(`${link} is a symbolic link: not followed`)
    expect(String(err)).not.toContain("TOPSECRET")
    expect(await readNoFollow(secret)).toBe("TOPSECRET-content")
    await expect(readNoFollow(secret, 4)).rejects.toThrow(/more than the agent ever writes there/)
    // the bound is the most the agent writes: a file of exactly that many bytes is read
    expect(await readNoFollow(secret, "TOPSECRET-content".length)).toBe("TOPSECRET-content")
    await expect(readNoFollow(path.join(dir, "absent"))).rejects.toMatchObject({ code: "ENOENT" })
    await expect(readNoFollow(dir)).rejects.toThrow(/not a regular file/)
  })

  it("links planted under the temp names the agent once used (pid, sequence) are never written through", async () => {
    const dir = tempDir()
    const victim = path.join(dir, "victim.txt")
    fs.writeFileSync(victim, "precious")
    const cordon = cordonFilePath(dir)
    const pidFile = pidFilePath(dir)
    // the old names: `cordon.json.<pid>.<n>.tmp` (durableFile.ts) and `engine.pid.<pid>.tmp` (pidFile.ts)
    for (let n = 1; n <= 200; n++) fs.symlinkSync(victim, `${cordon}.${process.pid}.${n}.tmp`)
    fs.symlinkSync(victim, `${pidFile}.${process.pid}.tmp`)
    await writeDurably(cordon, '{"since":1,"reason":"x"}')
    const record = { agentPid: 1, guardPid: undefined, pgid: 2, host: "127.0.0.1", port: 1, startedAt: 3 }
    await Effect.runPromise(writePidFile(pidFile, record))
    expect(fs.readFileSync(victim, "utf8")).toBe("precious")
    expect(fs.lstatSync(cordon).isFile()).toBe(true)
    expect(fs.statSync(pidFile).mode & 0o777).toBe(0o600)
    expect(await Effect.runPromise(readPidFile(pidFile))).toMatchObject({ pgid: 2 })
  })

  it("an engine pid file that is a link is no record (never followed)", async () => {
    const dir = tempDir()
    const elsewhere = path.join(dir, "elsewhere.json")
    fs.writeFileSync(elsewhere, JSON.stringify({ agentPid: 1, pgid: 2, host: "h", port: 1, startedAt: 3 }))
    fs.symlinkSync(elsewhere, pidFilePath(dir))
    expect(await Effect.runPromise(readPidFile(pidFilePath(dir)))).toBeUndefined()
  })
})
