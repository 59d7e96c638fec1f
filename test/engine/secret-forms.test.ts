// The encoded forms of a secret that the engine's output is scrubbed of (src/services/engine/SecretForms.ts), and
// lineRedactor's use of them (src/services/engine/Secrets.ts).
import { describe, expect, it } from "vitest"
import { encodedForms } from "../../src/services/engine/SecretForms.ts"
import { lineRedactor, REDACTED } from "../../src/services/engine/Secrets.ts"

const SECRET = `pa"ss\\wo/rd é+ x!`
const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64")

describe("encodedForms", () => {
  const forms = encodedForms(SECRET, 6)

  it("has the value escaped as JSON writes it: plain, with \\/, with \\uXXXX for non-ASCII; and as Python's repr", () => {
    expect(forms).toContain(JSON.stringify(SECRET).slice(1, -1))
    expect(forms).toContain(`pa\\"ss\\\\wo\\/rd é+ x!`)
    expect(forms).toContain(`pa\\"ss\\\\wo/rd \\u00e9+ x!`)
    expect(encodedForms("it's_a\\secret", 6)).toContain("it\\'s_a\\\\secret")
  })

  it("has the escapes other encoders write: upper-case hex (Jackson), <>& as Go's encoding/json escapes them", () => {
    expect(forms).toContain(`pa\\"ss\\\\wo/rd \\u00E9+ x!`)
    expect(encodedForms("Passw0rd&More<x>", 6)).toContain("Passw0rd\\u0026More\\u003cx\\u003e")
    // PHP's json_encode default: `/` as `\/` and non-ASCII as \uXXXX together
    expect(forms).toContain(`pa\\"ss\\\\wo\\/rd \\u00e9+ x!`)
  })

  it("has the value with every character as \\uXXXX (an encoder that escapes all), in lower- and upper-case hex", () => {
    const every = [..."JZ_key"].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")
    const f = encodedForms("JZ_key", 6)
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
    expect(forms.some((form) => form.length >= 8 && doc.includes(form))).toBe(true)
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
    const f = encodedForms(v, 6)
    expect(f).toContain(b64(v))
    expect(f).toContain(b64(v).replace(/=+$/, ""))
    expect(f).toContain(Buffer.from(v).toString("base64url"))
  })

  it("finds the value inside a longer base64 text at any offset (Basic auth of user:password, whoever the user)", () => {
    const v = "pw_SECRET9876"
    const f = encodedForms(v, 6)
    for (const user of ["a", "ab", "abc", "operator"]) {
      const header = b64(`${user}:${v}`)
      expect(f.some((form) => header.includes(form))).toBe(true)
    }
  })

  it("finds a value inside a longer base64 text where a form covers exactly minBytes of it", () => {
    // 7 bytes: at these offsets (value from a group's first or third byte) two whole groups, 6 bytes, lie in it
    const v = "pw_SEC7"
    const f = encodedForms(v, 6)
    for (const user of ["ab", "abcd"]) {
      const header = b64(`${user}:${v}@tail`)
      expect(
        f.some((form) => header.includes(form)),
        user
      ).toBe(true)
    }
  })

  it("takes no base64 form that covers fewer than minBytes of the value, and not the value itself", () => {
    const f = encodedForms("abcdefg", 6)
    expect(f.every((form) => form.length >= 8)).toBe(true)
    expect(encodedForms("plain_value", 6)).not.toContain("plain_value")
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
