// How long each engine's HTTP server keeps an idle connection, and what its answers say of it: the node:http
// options and the per-answer framing the simulator's server runs with (src/programs/sim.ts).
// - vLLM and SGLang run uvicorn, which closes a connection `timeout_keep_alive` seconds after its last answer
//   (HttpToolsProtocol.on_response_complete: loop.call_later(timeout_keep_alive, timeout_keep_alive_handler)) and
//   says nothing of it on a kept connection: no Keep-Alive header, no Connection header; `connection: close` only
//   when the request asked for it (encode/uvicorn uvicorn/protocols/http/httptools_impl.py, h11_impl.py).
//   vLLM's timeout is VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 (vllm-project/vllm vllm/envs.py; passed as
//   timeout_keep_alive by vllm/entrypoints/openai/api_server.py run_server_worker); SGLang's is 5
//   (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py launch_server, `timeout_keep_alive=5`).
// - llama-server (cpp-httplib): 5 s and 100 requests, with its own headers (context.ts llamaFraming).
// - mlx-lm: Python's http.server (ThreadingHTTPServer, BaseHTTPRequestHandler) with its default protocol_version
//   HTTP/1.0 (ml-explore/mlx-lm mlx_lm/server.py APIHandler sets none): every connection is closed after its one
//   answer, with no Connection header, and a body without Content-Length (a stream) ends with the connection.
//   node:http writes an HTTP/1.1 status line (no public way to write 1.0), and an HTTP/1.1 answer with no Connection
//   header says the connection is kept: a client (undici) pools it, where mlx-lm's HTTP/1.0 answer makes it close,
//   and may send its next request on it as the server closes it. So `Connection: close`, which says on HTTP/1.1 what
//   HTTP/1.0 says alone.
import type * as http from "node:http"
import { LLAMA_KEEP_ALIVE_S } from "./context.ts"
import type { Flavor } from "./simConfig.ts"

/** SGLang's uvicorn.run(..., timeout_keep_alive=5). */
export const SGLANG_KEEP_ALIVE_S = 5

/** vllm/envs.py: `int(os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5"))`. */
export const vllmKeepAliveS = (env: Record<string, string | undefined>): number => {
  const n = Number(env.VLLM_HTTP_TIMEOUT_KEEP_ALIVE?.trim() ?? "5")
  return Number.isInteger(n) && n >= 0 ? n : 5
}

/** The node:http server options for a flavor: its engine's idle-connection timeout, to the millisecond. */
export const keepAliveOptions = (flavor: Flavor, env: Record<string, string | undefined>): http.ServerOptions => {
  if (flavor === "mlx") return { noDelay: true }
  // node waits keepAliveTimeoutBuffer (1 s) past the timeout before it closes; uvicorn and cpp-httplib close at it
  if (flavor === "llama_cpp")
    return { keepAliveTimeout: LLAMA_KEEP_ALIVE_S * 1000, keepAliveTimeoutBuffer: 0, noDelay: true }
  const seconds = flavor === "vllm" ? vllmKeepAliveS(env) : SGLANG_KEEP_ALIVE_S
  // node reads a timeout of 0 as none: uvicorn's 0 closes at once, here after 1 ms
  return { keepAliveTimeout: Math.max(1, seconds * 1000), keepAliveTimeoutBuffer: 0, noDelay: true }
}

/** What each answer says of its connection (llama-server's own framing is context.ts llamaFraming). */
export const frameConnection = (flavor: Flavor, res: http.ServerResponse): void => {
  if (flavor === "mlx") {
    // HTTP/1.0's closing, said on node's HTTP/1.1 status line (above)
    res.setHeader("connection", "close")
    res.shouldKeepAlive = false
    res.useChunkedEncodingByDefault = false
    return
  }
  // uvicorn: nothing on a kept connection (node would write `Connection: keep-alive` and `Keep-Alive`); a closing
  // one keeps node's `Connection: close`
  if ((flavor === "vllm" || flavor === "sglang") && res.shouldKeepAlive) res.removeHeader("connection")
}

/** The request listener, its answers framed as the flavor's server frames them. */
export const framed =
  (flavor: Flavor, listener: http.RequestListener): http.RequestListener =>
  (req, res) => {
    frameConnection(flavor, res)
    listener(req, res)
  }
