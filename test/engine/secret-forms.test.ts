// The encoded forms of a secret that the engine's output is scrubbed of (src/services/engine/SecretForms.ts), and
// lineRedactor's use of them (src/services/engine/LineRedactor.ts).
import { describe, expect, it } from "vitest"
import { lineRedactor } from "../../src/services/engine/LineRedactor.ts"
import { base64InText, encodedForms } from "../../src/services/engine/SecretForms.ts"
import { REDACTED } from "../../src/services/engine/Secrets.ts"

const SECRET = `pa"ss\\wo/rd é+ x!`
const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64")

describe("encodedForms", () => {
  const forms = encodedForms(SECRET)

  it("has the value escaped as JSON writes it: plain, with \\/, with \\uXXXX for non-ASCII; and as Python's repr", () => {
    expect(forms).toContain(JSON.stringify(SECRET).slice(1, -1))
    expect(forms).toContain(`pa\\"ss\\\\wo\\/rd é+ x!`)
    expect(forms).toContain(`pa\\"ss\\\\wo/rd \\u00e9+ x!`)
    expect(encodedForms("it's_a\\secret")).toContain("it\\'s_a\\\\secret")
  })

  it("has the escapes other encoders write: upper-case hex (Jackson), <>& as Go's encoding/json escapes them", () => {
    expect(forms).toContain(`pa\\"ss\\\\wo/rd \\u00E9+ x!`)
    expect(encodedForms("Passw0rd&More<x>")).toContain("Passw0rd\\u0026More\\u003cx\\u003e")
    // PHP's json_encode default: `/` as `\/` and non-ASCII as \uXXXX together
    expect(forms).toContain(`pa\\"ss\\\\wo\\/rd \\u00e9+ x!`)
  })

  it("has the value with every character as \\uXXXX (an encoder that escapes all), in lower- and upper-case hex", () => {
    const every = [..."JZ_key"].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    const f = encodedForms("JZ_key")
    expect(f).toContain(every)
    expect(f).toContain("\\u004A\\u005A\\u005F\\u006B\\u0065\\u0079")
  })

  it("has the percent forms in lower-case hex too, and with every byte encoded", () => {
    expect(forms).toContain("pa%22ss%5cwo%2frd%20%c3%a9%2b%20x%21")
    const every = [...Buffer.from(SECRET)].map((b) => `%${b.toString(16).padStart(2, "0")}`).join("")
    expect(forms).toContain(every)
    expect(forms).toContain(every.toUpperCase())
  })

  it("has the base64 of the escaped forms (a JSON document that holds the value holds them)", () => {
    const doc = b64(JSON.stringify({ a: 1, key: SECRET, z: "tail" }))
    expect(base64InText(SECRET, 6).some((f) => f.core.length >= 8 && doc.includes(f.core))).toBe(true)
    expect(lineRedactor([SECRET])(`payload ${doc}`)).toContain(REDACTED)
  })

  it("has the value percent-encoded: encodeURIComponent, RFC 3986 strict, / kept, space as +", () => {
    expect(forms).toContain(encodeURIComponent(SECRET))
    expect(forms).toContain("pa%22ss%5Cwo%2Frd%20%C3%A9%2B%20x%21")
    expect(forms).toContain("pa%22ss%5Cwo/rd%20%C3%A9%2B%20x%21")
    expect(forms).toContain("pa%22ss%5Cwo/rd+%C3%A9%2B+x%21")
  })

  it("has the value's base64, standard and URL-safe, padded and not", () => {
    const v = "hf_SECRET12345>?"
    const f = encodedForms(v)
    expect(f).toContain(b64(v))
    expect(f).toContain(b64(v).replace(/=+$/, ""))
    expect(f).toContain(Buffer.from(v).toString("base64url"))
  })

  it("finds the value inside a longer base64 text at any offset (Basic auth of user:password, whoever the user)", () => {
    const v = "pw_SECRET9876"
    const cores = base64InText(v, 6).map((f) => f.core)
    for (const user of ["a", "ab", "abc", "operator"]) {
      const header = b64(`${user}:${v}`)
      expect(cores.some((core) => header.includes(core))).toBe(true)
    }
  })

  it("finds a value inside a longer base64 text where its whole groups of 3 bytes cover exactly minBytes of it", () => {
    // 7 bytes: at these offsets (value from a group's first or third byte) two whole groups, 6 bytes, lie in it
    const v = "pw_SEC7"
    const cores = base64InText(v, 6).map((f) => f.core)
    for (const user of ["ab", "abcd"]) {
      const header = b64(`${user}:${v}@tail`)
      expect(
        cores.some((core) => header.includes(core)),
        user
      ).toBe(true)
    }
  })

  it("takes no form where the value's whole groups of 3 bytes cover fewer than minBytes of it", () => {
    // from a group's second byte, "abcdefg" holds one whole group (3 bytes) only
    const cores = base64InText("abcdefg", 6).map((f) => f.core)
    expect(cores.every((core) => core.length >= 8)).toBe(true)
    expect(cores.some((core) => b64("xyz:abcdefg@yz").includes(core))).toBe(false)
    expect(cores.some((core) => b64("x:abcdefg@yz").includes(core))).toBe(true)
    expect(encodedForms("abcdefg").every((form) => form.length >= 8)).toBe(true)
    expect(encodedForms("plain_value")).not.toContain("plain_value")
  })

  it("blanks every base64 character that carries a bit of the value inside a longer text, and only those", () => {
    // A character carries bits 6i..6i+5 of the text's bytes; the value's bits are [8 * prefix, 8 * (prefix + len)).
    const v = "password1"
    const redact = lineRedactor([v])
    for (const user of ["u", "us", "use", "user", "users", "user_x", "operator"]) {
      for (const tail of ["", "@", "@h", "@ho"]) {
        for (const encoding of ["base64", "base64url"] as const) {
          const text = Buffer.from(`${user}:${v}${tail}`).toString(encoding)
          const from = 8 * (user.length + 1)
          const to = from + 8 * v.length
          const kept = `${text.slice(0, Math.floor(from / 6))}${REDACTED}${text.slice(Math.floor((to - 1) / 6) + 1)}`
          expect(redact(`auth ${text} ok`), `${user} ${tail} ${encoding}`).toBe(`auth ${kept} ok`)
        }
      }
    }
  })

  it("blanks the longer of two secrets that begin alike as it blanks it alone (their cores are the same text)", () => {
    const [short, long] = ["hf_SECRET1234", "hf_SECRET12345"]
    for (const secrets of [
      [short, long],
      [long, short]
    ]) {
      const redact = lineRedactor(secrets)
      for (const user of ["", "a", "ab"]) {
        const text = b64(`${user}${long}@h`)
        const from = 8 * user.length
        const to = from + 8 * long.length
        const kept = `${text.slice(0, Math.floor(from / 6))}${REDACTED}${text.slice(Math.floor((to - 1) / 6) + 1)}`
        expect(redact(text), `${secrets} ${user}`).toBe(kept)
      }
    }
  })
})

describe("lineRedactor and encoded secrets", () => {
  const redact = lineRedactor([SECRET, "pw_SECRET9876"])

  it("replaces a secret printed inside a JSON string", () => {
    expect(redact(`{"api_key": ${JSON.stringify(SECRET)}}`)).toBe(`{"api_key": "${REDACTED}"}`)
  })

  it("replaces a secret printed percent-encoded", () => {
    expect(redact(`GET /x?key=${encodeURIComponent(SECRET)}&a=1`)).toBe(`GET /x?key=${REDACTED}&a=1`)
  })

  it("replaces a secret printed in base64, alone or in a Basic auth header", () => {
    expect(redact(`token ${b64("pw_SECRET9876")} ok`)).toBe(`token ${REDACTED} ok`)
    const line = redact(`Authorization: Basic ${b64("admin:pw_SECRET9876")}`)
    expect(line).toContain(REDACTED)
    expect(line).not.toContain(b64("admin:pw_SECRET9876"))
  })

  it("returns a line without secrets as it is", () => {
    const line = "INFO: Started server process [123] (a+b) [x] $1 \\d"
    expect(redact(line)).toBe(line)
  })
})

describe("lineRedactor: a secret's lines, edges and characters", () => {
  it("scrubs every line of a secret written with CRLF line ends (a PEM or a token file from Windows)", () => {
    // output is split on \r too (OutputLines.ts): a line never holds `line-one-secret\r`, only `line-one-secret`
    const redact = lineRedactor(["line-one-secret\r\nline-two-secret\r\n"])
    expect(redact("a line-one-secret b line-two-secret c")).toBe(`a ${REDACTED} b ${REDACTED} c`)
  })

  it("blanks a base64 core's last characters where the base64 text ends the line", () => {
    // The characters after the core carry the value's last bits; at the line's end they are its last characters.
    const v = "s3cr3t-Pass+word/xyz"
    const redact = lineRedactor([v])
    for (const user of ["ab", "abc", "abcd", "abcde"]) {
      for (const encoding of ["base64", "base64url"] as const) {
        const text = Buffer.from(`${user}${v}`).toString(encoding).replace(/=+$/, "")
        const from = 8 * user.length
        const kept = `${text.slice(0, Math.floor(from / 6))}${REDACTED}`
        expect(redact(`k=${text}`), `${user} ${encoding}`).toBe(`k=${kept}`)
      }
    }
  })

  it("replaces two secrets side by side with one REDACTED", () => {
    const v = "s3cr3t-Pass+word/xyz"
    const redact = lineRedactor([v, "another-secret"])
    expect(redact(`x ${v}${v} y`)).toBe(`x ${REDACTED} y`)
    expect(redact(`x ${v}another-secret y`)).toBe(`x ${REDACTED} y`)
  })

  it("takes a secret holding every character a RegExp gives a meaning to as plain text", () => {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: the secret holds `${}` as it is, no placeholder
    const v = "a.*+?^${}()|[]\\/z"
    const redact = lineRedactor([v, "pw[open", "pw]close("])
    expect(redact(`key=${v} end`)).toBe(`key=${REDACTED} end`)
    expect(redact("a pw[open b pw]close( c")).toBe(`a ${REDACTED} b ${REDACTED} c`)
    // what the value would match as a pattern is left as it is
    expect(redact("key=aaaa^z pwo")).toBe("key=aaaa^z pwo")
  })
})
