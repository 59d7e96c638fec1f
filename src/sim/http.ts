// The two node:http chores every simulator server repeats: reading a request body and answering JSON.
// The OpenAI server, the vLLM side channel and the SGLang bootstrap server all use these, so a fix to
// framing (content-length, an empty body) lands in one place.
import type * as http from "node:http"

/** The whole request body as UTF-8. */
export const readBody = (req: http.IncomingMessage): Promise<string> =>
  new Promise((resolve, reject) => {
    const parts: Array<Buffer> = []
    req.on("data", (c: Buffer) => parts.push(c))
    req.on("end", () =>
      resolve(parts.length === 1 ? (parts[0]?.toString("utf8") ?? "") : Buffer.concat(parts).toString("utf8"))
    )
    req.on("error", reject)
  })

/**
 * A JSON answer with an exact content-length; `undefined` sends an empty body. `headers` add to or replace
 * the defaults (an engine's own content-type, `connection: close`).
 */
export const sendJson = (
  res: http.ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {}
): void => {
  const text = body === undefined ? "" : JSON.stringify(body)
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers
  })
  res.end(text)
}
