// A throwaway PKI for TLS tests, made at test time with /usr/bin/openssl in a temp dir (EC P-256, 1 day):
// a CA with a server certificate (SAN 127.0.0.1 and localhost) and a client certificate, plus an unrelated
// CA with its own client certificate (to check that the server refuses it). `issueServer` signs another
// server certificate with the main CA, for rotation tests. `cleanup` removes the directory.
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"

const OPENSSL = "/usr/bin/openssl"

export interface CertFiles {
  readonly certFile: string
  readonly keyFile: string
  readonly cert: Buffer
  readonly key: Buffer
}

export interface TestPki {
  readonly dir: string
  readonly ca: CertFiles
  readonly server: CertFiles
  readonly client: CertFiles
  readonly otherCa: CertFiles
  /** A client certificate signed by `otherCa`. */
  readonly otherClient: CertFiles
  /** Signs a new server certificate (SAN 127.0.0.1, localhost) with `ca`, files named `<name>.crt/.key`. */
  issueServer(name: string): CertFiles
  cleanup(): void
}

const openssl = (args: ReadonlyArray<string>, cwd: string): void => {
  execFileSync(OPENSSL, args, { cwd, stdio: ["ignore", "ignore", "pipe"] })
}

const read = (dir: string, name: string): CertFiles => {
  const certFile = path.join(dir, `${name}.crt`)
  const keyFile = path.join(dir, `${name}.key`)
  return { certFile, keyFile, cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) }
}

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

const makeCa = (dir: string, name: string): CertFiles => {
  openssl(
    [
      "req",
      "-x509",
      ...EC,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.crt`,
      "-days",
      "1",
      "-subj",
      `/CN=${name}`,
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign"
    ],
    dir
  )
  return read(dir, name)
}

const issue = (dir: string, ca: string, name: string, usage: "serverAuth" | "clientAuth"): CertFiles => {
  const ext = path.join(dir, `${name}.ext`)
  const san = usage === "serverAuth" ? "subjectAltName=IP:127.0.0.1,DNS:localhost\n" : ""
  fs.writeFileSync(ext, `${san}extendedKeyUsage=${usage}\nbasicConstraints=CA:FALSE\n`)
  openssl(["req", ...EC, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`], dir)
  openssl(
    [
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      `${ca}.crt`,
      "-CAkey",
      `${ca}.key`,
      "-set_serial",
      `0x${Date.now().toString(16)}${Math.floor(Math.random() * 0xffff).toString(16)}`,
      "-days",
      "1",
      "-out",
      `${name}.crt`,
      "-extfile",
      ext
    ],
    dir
  )
  return read(dir, name)
}

/** Creates the PKI; synchronous openssl calls, about 100 ms in all. */
export const makeTestPki = (): TestPki => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-pki-"))
  const ca = makeCa(dir, "ca")
  const otherCa = makeCa(dir, "other-ca")
  return {
    dir,
    ca,
    server: issue(dir, "ca", "server", "serverAuth"),
    client: issue(dir, "ca", "client", "clientAuth"),
    otherCa,
    otherClient: issue(dir, "other-ca", "other-client", "clientAuth"),
    issueServer: (name) => issue(dir, "ca", name, "serverAuth"),
    cleanup: () => fs.rmSync(dir, { recursive: true, force: true })
  }
}
