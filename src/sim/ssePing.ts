// The SSE keep-alive of a stream with nothing more to send, as llama-server writes it.
import type * as http from "node:http"
import { setTimeout as sleep } from "node:timers/promises"

/**
 * A stream with nothing more to send: llama-server writes an SSE comment every `pingMs` of silence so that
 * clients and proxies do not time it out (tools/server/server-context.cpp handle_completions_impl, "sending
 * SSE ping"); the others write nothing. Until the client goes.
 */
export const pingUntil = async (
  res: http.ServerResponse,
  pingMs: number | undefined,
  gone: () => boolean,
  closed: Promise<void>
): Promise<void> => {
  if (pingMs === undefined) return closed
  for (;;) {
    await Promise.race([sleep(pingMs), closed])
    if (gone()) return
    res.write(":\n\n")
  }
}
