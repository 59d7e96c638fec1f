// security.allowed_client_names, pure: which certificates a list admits (DNS names, one-label wildcards, URIs such
// as SPIFFE IDs, IP addresses; the CN only for a certificate with none of those), what the config refuses as an
// entry, how Node's subjectaltname string is read (quoted values), and the check's log: one warning per peer and
// window, the rest at debug, every refusal counted. Also the config: the key without mTLS is an error.

import { execFileSync } from "node:child_process"
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"
import { makeClientNameCheck } from "../../src/layers/tls/clientNameCheck.ts"
import {
  ClientNameAllowlist,
  certificateIdentity,
  clientNameProblem,
  type PeerCertificateNames,
  splitAltNames
} from "../../src/services/tls/ClientNames.ts"

const san = (subjectaltname: string, CN?: string): PeerCertificateNames => ({
  subjectaltname,
  subject: CN === undefined ? {} : { CN }
})
const cnOnly = (CN: string | ReadonlyArray<string>): PeerCertificateNames => ({ subject: { CN } })

const ROUTER_SPIFFE = "spiffe://cluster.local/ns/cgn/sa/router"

/** [case, allowed names, certificate, admitted]. */
const table: ReadonlyArray<readonly [string, ReadonlyArray<string>, PeerCertificateNames, boolean]> = [
  ["DNS: exact", ["router.cgn.svc"], san("DNS:router.cgn.svc"), true],
  ["DNS: case-insensitive both ways", ["Router.CGN.svc"], san("DNS:ROUTER.cgn.SVC"), true],
  ["DNS: another name", ["router.cgn.svc"], san("DNS:batch.cgn.svc"), false],
  ["DNS: a longer name is no match", ["router.cgn.svc"], san("DNS:evil.router.cgn.svc"), false],
  ["DNS: any of several SANs", ["router.cgn.svc"], san("DNS:a.example, DNS:router.cgn.svc"), true],
  ["DNS wildcard: one label", ["*.router.cgn.svc"], san("DNS:router-0.router.cgn.svc"), true],
  ["DNS wildcard: not the bare suffix", ["*.router.cgn.svc"], san("DNS:router.cgn.svc"), false],
  ["DNS wildcard: not two labels", ["*.router.cgn.svc"], san("DNS:a.b.router.cgn.svc"), false],
  ["DNS wildcard: a certificate's own * is no name", ["*.router.cgn.svc"], san("DNS:*.router.cgn.svc"), false],
  ["DNS exact: a certificate's * matches nothing", ["a.router.cgn.svc"], san("DNS:*.router.cgn.svc"), false],
  ["URI: SPIFFE ID exact", [ROUTER_SPIFFE], san(`URI:${ROUTER_SPIFFE}`), true],
  ["URI: another service account", [ROUTER_SPIFFE], san("URI:spiffe://cluster.local/ns/cgn/sa/batch"), false],
  ["URI: no prefix match", [ROUTER_SPIFFE], san(`URI:${ROUTER_SPIFFE}-2`), false],
  ["URI: case-sensitive", [ROUTER_SPIFFE], san(`URI:${ROUTER_SPIFFE.toUpperCase()}`), false],
  ["URI: a DNS pattern does not match a URI", ["cluster.local"], san("URI:spiffe://cluster.local/x"), false],
  ["IPv4", ["10.0.0.7"], san("IP Address:10.0.0.7"), true],
  ["IPv4: another", ["10.0.0.7"], san("IP Address:10.0.0.8"), false],
  ["IPv6: as OpenSSL prints it", ["fd00::7"], san("IP Address:FD00:0:0:0:0:0:0:7"), true],
  ["IP: a DNS SAN spelled as the address is no IP", ["10.0.0.7"], san("DNS:10.0.0.7"), false],
  ["CN fallback: no SAN", ["router"], cnOnly("router"), true],
  ["CN fallback: wildcard", ["*.router.cgn.svc"], cnOnly("r1.router.cgn.svc"), true],
  ["CN: never beside a SAN", ["router"], san("DNS:other.cgn.svc", "router"), false],
  ["CN: never beside a URI SAN", ["router"], san(`URI:${ROUTER_SPIFFE}`, "router"), false],
  ["CN: an email SAN alone leaves the CN", ["router"], san("email:ops@example.com", "router"), true],
  ["CN: two CNs are ambiguous", ["router"], cnOnly(["router", "other"]), false],
  ["CN: an IP pattern never matches a CN", ["10.0.0.7"], cnOnly("10.0.0.7"), false],
  ["no names at all", ["router"], {}, false],
  ["quoted SAN value (a comma inside)", ["router.cgn.svc"], san('DNS:"evil\\u002c DNS:router.cgn.svc"'), false],
  ["empty list: any certificate", [], san("DNS:anything"), true],
  ["several entries, one kind matches", ["10.0.0.1", ROUTER_SPIFFE], san(`URI:${ROUTER_SPIFFE}`), true]
]

describe("ClientNameAllowlist", () => {
  it.each(table)("%s", (_, names, certificate, admitted) => {
    expect(new ClientNameAllowlist(names).admit(certificate) === undefined).toBe(admitted)
  })

  it("names the certificate's names and the key in the refusal", () => {
    const refusal = new ClientNameAllowlist(["router.cgn.svc"]).admit(
      san(`DNS:batch.cgn.svc, URI:${ROUTER_SPIFFE}x, IP Address:10.0.0.9`)
    )
    expect(refusal?.message).toBe(
      `the client certificate (DNS:batch.cgn.svc, URI:${ROUTER_SPIFFE}x, IP:10.0.0.9) is not allowed by security.allowed_client_names on this agent`
    )
    expect(new ClientNameAllowlist(["x.y"]).admit(cnOnly("client"))?.names).toBe("CN=client")
    expect(new ClientNameAllowlist(["x.y"]).admit({})?.names).toBe("no DNS, URI or IP name and no single CN")
    const many = Array.from({ length: 10 }, (_, i) => `DNS:n${i}.example`).join(", ")
    expect(new ClientNameAllowlist(["x.y"]).admit(san(many))?.names).toBe(
      `${Array.from({ length: 8 }, (_, i) => `DNS:n${i}.example`).join(", ")} and 2 more`
    )
  })

  it("reads a real certificate's SANs as node:crypto prints them (IPv6 uppercase, a comma quoted)", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cgn-san-"))
    try {
      const cnf = path.join(dir, "cnf")
      fs.writeFileSync(
        cnf,
        `[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName=@alt\n[alt]\nDNS.1=Router.cgn.svc\nURI.1=${ROUTER_SPIFFE}\nIP.1=fd00::7\nDNS.2=odd,name\n`
      )
      execFileSync(
        "/usr/bin/openssl",
        ["req", "-x509", "-config", cnf, "-extensions", "ext", "-newkey", "ec", "-pkeyopt"]
          .concat(["ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "k", "-out", "c", "-days", "1"])
          .concat(["-subj", "/CN=router"]),
        { cwd: dir, stdio: ["ignore", "ignore", "pipe"] }
      )
      const x = new crypto.X509Certificate(fs.readFileSync(path.join(dir, "c")))
      const peer = { subjectaltname: x.subjectAltName, subject: { CN: "router" } }
      expect(certificateIdentity(peer)).toEqual({
        dns: ["Router.cgn.svc", "odd,name"],
        uri: [ROUTER_SPIFFE],
        ip: ["FD00:0:0:0:0:0:0:7"]
      })
      const admitted = (allowed: string) => new ClientNameAllowlist([allowed]).admit(peer) === undefined
      expect(["router.cgn.svc", ROUTER_SPIFFE, "fd00::7", "name", "router"].map(admitted)).toEqual(
        // "name" is half of the quoted "odd,name"; "router" the CN, not read beside SANs
        [true, true, true, false, false]
      )
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe("splitAltNames", () => {
  it("splits on ', ' and unquotes JSON-quoted values; malformed quoting yields nothing", () => {
    expect(splitAltNames("DNS:a, URI:b")).toEqual(["DNS:a", "URI:b"])
    expect(splitAltNames('DNS:"a\\u002c DNS:b", DNS:c')).toEqual(["DNS:a, DNS:b", "DNS:c"])
    expect(splitAltNames('DNS:"unterminated')).toBeUndefined()
  })
})

describe("clientNameProblem (the config's check of each entry)", () => {
  it.each([
    ["router.cgn.svc", undefined],
    ["router", undefined],
    ["*.router.cgn.svc", undefined],
    [ROUTER_SPIFFE, undefined],
    ["10.0.0.1", undefined],
    ["fd00::1", undefined],
    ["", "an empty name matches no certificate"],
    ["a b", '"a b": a client name has no spaces or commas (one name per list entry)'],
    ["*.svc", '"*.svc": a wildcard needs at least two labels after it, as in "*.router.cgn.svc"'],
    ["r*.cgn.svc", '"r*.cgn.svc": a wildcard is a whole first label only, as in "*.router.cgn.svc" (one label)'],
    ["a.*.svc", '"a.*.svc": a wildcard is a whole first label only, as in "*.router.cgn.svc" (one label)'],
    ["router.cgn.svc.", '"router.cgn.svc.": a DNS name has no empty labels (leading, trailing or double dots)'],
    [
      "spiffe://cluster.local/ns/cgn/*",
      '"spiffe://cluster.local/ns/cgn/*": URIs are matched exactly, without wildcards or prefixes; list each one'
    ]
  ])("%j", (name, problem) => {
    expect(clientNameProblem(name)).toBe(problem)
  })
})

describe("a subjectAltName that does not parse", () => {
  it("trusts nothing of the certificate, its CN neither", () => {
    const peer = { subjectaltname: 'DNS:"unterminated', subject: { CN: "router.cgn.svc" } }
    expect(certificateIdentity(peer)).toEqual({ dns: [], uri: [], ip: [] })
    expect(new ClientNameAllowlist(["router.cgn.svc"]).admit(peer)?._tag).toBe("ClientNotAllowed")
  })
})

describe("the check's log and count", () => {
  it("warns once per peer and window, logs the rest at debug with the count, counts every refusal", () => {
    const lines: Array<string> = []
    let now = 0
    const checking = makeClientNameCheck(
      ["router.cgn.svc"],
      (warn, _line, fields) =>
        lines.push(`${warn ? "Warning" : "Debug"} ${fields.peer} ${fields.not_warned_since_last ?? 0}`),
      () => now
    )
    const other = san("DNS:other.cgn.svc")
    expect(checking.check.admit(san("DNS:router.cgn.svc"), "10.0.0.1")).toBeUndefined()
    expect(checking.check.admit(other, "10.0.0.2")?._tag).toBe("ClientNotAllowed")
    checking.check.admit(other, "10.0.0.2")
    checking.check.admit(other, "10.0.0.3")
    now = 60_000
    checking.check.admit(other, "10.0.0.2")
    expect(lines).toEqual(["Warning 10.0.0.2 0", "Debug 10.0.0.2 0", "Warning 10.0.0.3 0", "Warning 10.0.0.2 1"])
    expect(checking.refused()).toBe(4)
  })
})

describe("the refusal's log line", () => {
  it("says what is refused and how, with the peer and the names it presented; the count of quiet ones only when there were some", () => {
    const logged: Array<[boolean, string, Readonly<Record<string, string | number>>]> = []
    let now = 0
    const checking = makeClientNameCheck(
      ["router.cgn.svc"],
      (warn, line, fields) => logged.push([warn, line, fields]),
      () => now
    )
    const other = san("DNS:other.cgn.svc, URI:spiffe://cluster.local/ns/batch/sa/job")
    const names = "DNS:other.cgn.svc, URI:spiffe://cluster.local/ns/batch/sa/job"
    checking.check.admit(other, "10.0.0.2")
    checking.check.admit(other, "10.0.0.2")
    now = 60_000
    checking.check.admit(other, "10.0.0.2")
    const line =
      "gRPC: client certificate not in security.allowed_client_names; every call on the connection is refused PERMISSION_DENIED"
    expect(logged).toEqual([
      [true, line, { peer: "10.0.0.2", names }],
      [false, line, { peer: "10.0.0.2", names }],
      [true, line, { peer: "10.0.0.2", names, not_warned_since_last: 1 }]
    ])
  })
})

describe("config: security.allowed_client_names", () => {
  const MODEL = '[models.m]\nhf_repo = "a/b"\n'
  const problemsOf = (text: string): ReadonlyArray<string> => {
    const r = decodeConfig(text, "t.toml", {})
    return Result.isFailure(r) ? r.failure.problems : []
  }
  it("is an error without require_mtls (naming the key and why), fine with it, and an empty list is no list", () => {
    expect(problemsOf(`[security]\nallowed_client_names = ["router.cgn.svc"]\n${MODEL}`)).toEqual([
      "security.allowed_client_names: names client certificates, and without mTLS the gRPC server asks for none (anyone who reaches it can call); set security.require_mtls = true with ca_file, cert_file and key_file, or remove the key"
    ])
    const mtls = '[security]\nrequire_mtls = true\nca_file = "/ca"\ncert_file = "/c"\nkey_file = "/k"\n'
    expect(problemsOf(`${mtls}allowed_client_names = ["router.cgn.svc", "${ROUTER_SPIFFE}"]\n${MODEL}`)).toEqual([])
    expect(problemsOf(`[security]\nallowed_client_names = []\n${MODEL}`)).toEqual([])
  })
  it("refuses a malformed entry, naming the key", () => {
    const problems = problemsOf(
      `[security]\nrequire_mtls = true\nca_file = "/ca"\ncert_file = "/c"\nkey_file = "/k"\nallowed_client_names = ["*.svc"]\n${MODEL}`
    )
    expect(problems).toHaveLength(1)
    expect(problems[0]).toMatch(
      /^security\.allowed_client_names\[0\]: .*"\*\.svc": a wildcard needs at least two labels/
    )
  })
})
