// Which names and flags hold secrets, and the scrubbing of their values from the engine's output lines
// (src/services/engine/Secrets.ts).
import { describe, expect, it } from "vitest"
import { isSecretFlag, isSecretName, lineRedactor, REDACTED, secretValues } from "../../src/services/engine/Secrets.ts"

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
