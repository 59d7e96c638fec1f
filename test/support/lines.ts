// The lines a child process writes to a stream, kept in order, with a bounded wait for a matching line.
// Shared by the simulator and agent fixtures (test/support/sim.ts, test/support/agent.ts).
import type { Readable } from "node:stream"

export interface LineLog {
  /** Every complete line so far, in order. */
  readonly lines: Array<string>
  /** The first line (already seen or still to come) matching `pred`; rejects after `timeoutMs` with `what` and the log. */
  readonly waitFor: (pred: (line: string) => boolean, timeoutMs: number, what: string) => Promise<string>
}

/** Follows `stream` line by line; `onLine` sees each line before any waiter does. */
export const followLines = (stream: Readable | null | undefined, onLine?: (line: string) => void): LineLog => {
  const lines: Array<string> = []
  const waiters = new Set<{ pred: (l: string) => boolean; resolve: (l: string) => void }>()
  let buf = ""
  stream?.setEncoding("utf8")
  stream?.on("data", (chunk: string) => {
    buf += chunk
    let nl = buf.indexOf("\n")
    while (nl >= 0) {
      const line = buf.slice(0, nl)
      buf = buf.slice(nl + 1)
      lines.push(line)
      onLine?.(line)
      for (const w of waiters) {
        if (w.pred(line)) {
          waiters.delete(w)
          w.resolve(line)
        }
      }
      nl = buf.indexOf("\n")
    }
  })
  const waitFor = (pred: (line: string) => boolean, timeoutMs: number, what: string): Promise<string> => {
    const found = lines.find(pred)
    if (found !== undefined) return Promise.resolve(found)
    return new Promise((resolve, reject) => {
      const w = {
        pred,
        resolve: (l: string) => {
          clearTimeout(timer)
          resolve(l)
        }
      }
      const timer = setTimeout(() => {
        waiters.delete(w)
        reject(new Error(`${what} not seen within ${timeoutMs} ms; log:\n${lines.slice(-40).join("\n")}`))
      }, timeoutMs)
      waiters.add(w)
    })
  }
  return { lines, waitFor }
}
