// OpenAI response shapes (pure): SSE chunk templates for streams and whole bodies for non-streaming calls.
// A stream's constant JSON prefix/suffix is built once per request, so each token costs one small
// JSON.stringify of the token text and a string concatenation, never a stringify of a big object.
import type { Flavor } from "./args.ts"

export type Endpoint = "chat" | "completion"

export interface Usage {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly total_tokens: number
}

export interface StreamTemplate {
  /** The chat stream's opening role chunk (empty for completions). */
  readonly first: string
  token(text: string): string
  finish(reason: string): string
  usage(u: Usage): string
}

export const DONE = "data: [DONE]\n\n"

const owner = (f: Flavor): string => (f === "llama_cpp" ? "llamacpp" : f)

/** SSE framing for one JSON text. */
export const sse = (json: string): string => `data: ${json}\n\n`

export const streamTemplate = (endpoint: Endpoint, id: string, model: string, created: number): StreamTemplate => {
  const object = endpoint === "chat" ? "chat.completion.chunk" : "text_completion"
  const head = `{"id":${JSON.stringify(id)},"object":"${object}","created":${created},"model":${JSON.stringify(model)},"choices":`
  if (endpoint === "chat") {
    const tokPre = `data: ${head}[{"index":0,"delta":{"content":`
    const tokPost = `},"logprobs":null,"finish_reason":null}]}\n\n`
    return {
      first: `data: ${head}[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`,
      token: (t) => tokPre + JSON.stringify(t) + tokPost,
      finish: (r) =>
        `data: ${head}[{"index":0,"delta":{},"logprobs":null,"finish_reason":${JSON.stringify(r)},"stop_reason":null}]}\n\n`,
      usage: (u) => `data: ${head}[],"usage":${JSON.stringify(u)}}\n\n`
    }
  }
  const tokPre = `data: ${head}[{"index":0,"text":`
  const tokPost = `,"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n`
  return {
    first: "",
    token: (t) => tokPre + JSON.stringify(t) + tokPost,
    finish: (r) =>
      `data: ${head}[{"index":0,"text":"","logprobs":null,"finish_reason":${JSON.stringify(r)},"stop_reason":null}]}\n\n`,
    usage: (u) => `data: ${head}[],"usage":${JSON.stringify(u)}}\n\n`
  }
}

/** The non-streaming response object. */
export const fullBody = (
  flavor: Flavor,
  endpoint: Endpoint,
  id: string,
  model: string,
  created: number,
  text: string,
  finishReason: string,
  usage: Usage,
  kvTransferParams: unknown
): Record<string, unknown> => {
  const choice =
    endpoint === "chat"
      ? {
          index: 0,
          message: { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: finishReason,
          stop_reason: null
        }
      : { index: 0, text, logprobs: null, finish_reason: finishReason, stop_reason: null }
  const body: Record<string, unknown> = {
    id,
    object: endpoint === "chat" ? "chat.completion" : "text_completion",
    created,
    model,
    choices: [choice],
    usage
  }
  if (flavor === "vllm") body.kv_transfer_params = kvTransferParams ?? null
  return body
}

/** GET /v1/models per flavor. */
export const modelsBody = (
  flavor: Flavor,
  servedName: string,
  model: string,
  maxModelLen: number | undefined,
  created: number
): unknown => {
  const entry: Record<string, unknown> = { id: servedName, object: "model", created, owned_by: owner(flavor) }
  if (flavor === "vllm") {
    Object.assign(entry, { root: model, parent: null, max_model_len: maxModelLen ?? 4096, permission: [] })
  } else if (flavor === "sglang") {
    Object.assign(entry, { root: servedName, max_model_len: maxModelLen ?? 4096 })
  } else if (flavor === "llama_cpp") {
    Object.assign(entry, { meta: { n_ctx_train: maxModelLen ?? 4096 } })
    return {
      models: [{ name: servedName, model: servedName, type: "model", capabilities: ["completion"] }],
      object: "list",
      data: [entry]
    }
  } else {
    delete entry.owned_by
  }
  return { object: "list", data: [entry] }
}
