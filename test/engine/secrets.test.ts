// Which names and flags hold secrets, and the scrubbing of their values from the engine's output lines
// (src/services/engine/Secrets.ts, LineRedactor.ts).
import { describe, expect, it } from "vitest"
import { redactArgv, redactEnv } from "../../src/layers/engine/backends/redact.ts"
import { lineRedactor } from "../../src/services/engine/LineRedactor.ts"
import {
  isHeaderListName,
  isSecretFlag,
  isSecretName,
  REDACTED,
  secretValues
} from "../../src/services/engine/Secrets.ts"

describe("isSecretName", () => {
  it.each([
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "hfToken",
    "GITHUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_APIKEY",
    "SSH_KEY",
    "API_KEYS",
    "DB_PASSWORD",
    "PGPASSWORD",
    "DB_PASSWD",
    "SMTP_PASS",
    "GPG_PASSPHRASE",
    "WANDB_CRED",
    "AWS_CREDS",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "PROXY_AUTH",
    "HTTP_AUTHORIZATION",
    "SESSION",
    "SESSION_COOKIE",
    "PRIVATE_KEY",
    "REQUEST_SIGNATURE",
    "client_secret",
    "my.secret.value"
  ])("%s is a secret's name", (name) => expect(isSecretName(name)).toBe(true))

  it.each([
    "PATH",
    "PWD",
    "HOME",
    "KEYBOARD",
    "MONKEY_PATCH",
    "TOKENIZERS_PARALLELISM",
    "VLLM_MAX_TOKENS",
    "AUTHOR",
    "CREDIT_LIMIT",
    "PASSTHROUGH",
    "CUDA_VISIBLE_DEVICES",
    "MALLOC_ARENA_MAX",
    "UCX_TLS"
  ])("%s is not", (name) => expect(isSecretName(name)).toBe(false))
})

describe("isSecretFlag", () => {
  it.each(["--api-key", "--hf-token", "--token", "--admin-api-key", "-hft", "--password"])("%s takes a secret", (f) =>
    expect(isSecretFlag(f)).toBe(true)
  )
  it.each([
    "--tokenizer",
    "--max-num-batched-tokens",
    "--long-prefill-token-threshold",
    "--api-key-file",
    "model",
    "-1"
  ])("%s does not", (f) => expect(isSecretFlag(f)).toBe(false))
})

describe("secretValues", () => {
  it("takes the secret-named variables and the values of secret flags, both spellings", () => {
    const values = secretValues(
      { HF_TOKEN: "hf_SECRET123", WANDB_CRED: "wandbcred_SECRET125", PATH: "/usr/bin", UNSET_TOKEN: undefined },
      ["vllm", "serve", "m", "--hf-token", "hf_ARGSECRET1", "--api-key=apikey_SECRET2", "--port", "8000"]
    )
    expect([...values].sort()).toEqual(["apikey_SECRET2", "hf_ARGSECRET1", "hf_SECRET123", "wandbcred_SECRET125"])
  })

  it("does not take a flag that follows a secret flag as its value", () => {
    expect(secretValues({}, ["--api-key", "--port", "8000"])).toEqual([])
  })
})

describe("lineRedactor", () => {
  const redact = lineRedactor(["hf_SECRET123", "apikey_SECRET2", "short", "hf_SECRET123_and_more"])

  it("replaces every occurrence of every value", () => {
    expect(
      redact("non-default args: {'api_key': ['apikey_SECRET2'], 'hf_token': 'hf_SECRET123', x: hf_SECRET123}")
    ).toBe(`non-default args: {'api_key': ['${REDACTED}'], 'hf_token': '${REDACTED}', x: ${REDACTED}}`)
  })

  it("replaces a value that contains another whole", () => {
    expect(redact("HF=hf_SECRET123_and_more")).toBe(`HF=${REDACTED}`)
  })

  it("leaves values under 6 characters, so common words are not blanked", () => {
    expect(redact("a short line")).toBe("a short line")
  })

  it("returns a line without secrets as it is", () => {
    const line = "INFO: Started server process [123]"
    expect(redact(line)).toBe(line)
    expect(lineRedactor([])(line)).toBe(line)
  })

  it("scrubs each line of a value of several lines (a PEM key)", () => {
    const r = lineRedactor(["-----BEGIN KEY-----\r\nMIIEvQIBADANBgkqhkiG9w0B\n-----END KEY-----"])
    expect(r("oops: MIIEvQIBADANBgkqhkiG9w0B")).toBe(`oops: ${REDACTED}`)
  })
})

describe("header lists (OTEL_EXPORTER_OTLP_HEADERS)", () => {
  it.each([
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS"
  ])("%s is a header list", (name) => expect(isHeaderListName(name)).toBe(true))
  it.each(["HEADERS_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT"])("%s is not", (name) =>
    expect(isHeaderListName(name)).toBe(false)
  )

  const headers = "authorization=Bearer%20otel_SECRET1, x-api-key = otel_SECRET2 ,bare_SECRET3"

  it("has each value taken as a secret: as written, percent-decoded, and the credential after its scheme", () => {
    expect([...secretValues({ OTEL_EXPORTER_OTLP_HEADERS: headers }, [])].sort()).toEqual([
      "Bearer otel_SECRET1",
      "Bearer%20otel_SECRET1",
      "bare_SECRET3",
      "otel_SECRET1",
      "otel_SECRET2"
    ])
  })

  it("shows the keys and hides the values in render and the spawn log", () => {
    expect(redactEnv({ OTEL_EXPORTER_OTLP_TRACES_HEADERS: headers })).toEqual({
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: `authorization=${REDACTED}, x-api-key = ${REDACTED} ,${REDACTED}`
    })
  })

  it("takes a flag's value as a header list when the flag's last word is HEADERS, as a variable's name", () => {
    expect(redactArgv(["--otlp-headers", headers, "--port", "8000", "--x-headers=a=b_SECRET7"])).toEqual([
      "--otlp-headers",
      `authorization=${REDACTED}, x-api-key = ${REDACTED} ,${REDACTED}`,
      "--port",
      "8000",
      `--x-headers=a=${REDACTED}`
    ])
    expect([...secretValues({}, ["--otlp-headers", headers])].sort()).toEqual([
      "Bearer otel_SECRET1",
      "Bearer%20otel_SECRET1",
      "bare_SECRET3",
      "otel_SECRET1",
      "otel_SECRET2"
    ])
    // not after a flag that takes no value, nor a flag of another name
    expect(redactArgv(["--otlp-headers", "--port", "a=b", "--headers-dir", "c=d"])).toEqual([
      "--otlp-headers",
      "--port",
      "a=b",
      "--headers-dir",
      "c=d"
    ])
  })

  it("has the values scrubbed from the engine's lines", () => {
    const redact = lineRedactor(secretValues({ OTEL_EXPORTER_OTLP_HEADERS: headers }, []))
    expect(redact("headers: {'authorization': 'Bearer otel_SECRET1'} token=otel_SECRET1 key=otel_SECRET2")).toBe(
      `headers: {'authorization': '${REDACTED}'} token=${REDACTED} key=${REDACTED}`
    )
  })
})

describe("URL credentials, whatever the name", () => {
  const env = {
    HTTPS_PROXY: "http://bob:proxy_SECRET4@proxy:3128",
    REPO: "https://ghp_TOKEN5678abcdef0123@github.com/o/r"
  }

  it("hides a URL's password (or its userinfo without one) in render and the spawn log", () => {
    expect(redactEnv(env)).toEqual({
      HTTPS_PROXY: `http://bob:${REDACTED}@proxy:3128`,
      REPO: `https://${REDACTED}@github.com/o/r`
    })
    expect(redactArgv(["--otlp-traces-endpoint", "https://u:p%40ss_SECRET@collector:4317", "--port", "8000"])).toEqual([
      "--otlp-traces-endpoint",
      `https://u:${REDACTED}@collector:4317`,
      "--port",
      "8000"
    ])
  })

  it("takes them as secrets, percent-decoded too", () => {
    expect([...secretValues(env, ["https://u:p%40ss_SECRET@collector:4317"])].sort()).toEqual([
      "ghp_TOKEN5678abcdef0123",
      "p%40ss_SECRET",
      "p@ss_SECRET",
      "proxy_SECRET4"
    ])
  })

  it("takes a credential after a known auth scheme alone, not the second word of any two-word secret", () => {
    expect(secretValues({ API_AUTH: "Bearer tok_abcdef123456" }, [])).toEqual([
      "Bearer tok_abcdef123456",
      "tok_abcdef123456"
    ])
    expect(secretValues({ DB_PASSWORD: "password incorrect" }, [])).toEqual(["password incorrect"])
  })

  it("reads a long word in one pass (a RegExp trying a scheme at each letter took a minute on 200k letters)", () => {
    const word = "x".repeat(200_000)
    expect(redactArgv([word, `${word}://u:long_SECRET@h`])).toEqual([word, `${word}://u:${REDACTED}@h`])
  })

  it("leaves a URL without credentials and other values as they are", () => {
    const plain = {
      VLLM_ENDPOINT: "http://host:8000/v1",
      CUDA_VISIBLE_DEVICES: "0,1",
      EMAIL: "a@b.c",
      EMPTY_USERINFO: "http://@host:8000",
      AT_IN_PATH: "https://host/a@b",
      NO_SCHEME: "1://u:p@h",
      // a user name without a password is no token (shorter than tokens are): not blanked in every engine line
      INDEX_URL: "https://pytorch@download.pytorch.org/whl"
    }
    expect(redactEnv(plain)).toEqual(plain)
    expect(secretValues(plain, ["--model", "org/model"])).toEqual([])
  })
})

describe("render and the spawn log (finding 8)", () => {
  it("hide a secret-named [engine].env value and show the others", () => {
    expect(redactEnv({ WANDB_CRED: "wandbcred_SECRET125", VLLM_ATTENTION_BACKEND: "FLASHINFER" })).toEqual({
      WANDB_CRED: REDACTED,
      VLLM_ATTENTION_BACKEND: "FLASHINFER"
    })
  })
})
