/**
 * HostShortage: what ran out on the agent's own host, in an operator's words (pure), from a failure's error code.
 * - Out of file descriptors (EMFILE: the agent's limit; ENFILE: the host's table): with too low a limit every open,
 *   socket and accept fails. Node names it in one of two shapes: a plain `ErrnoException` (`code: "EMFILE"`, from fs
 *   and net), or a `SystemError` (`code: "ERR_SYSTEM_ERROR"`) whose `errno` is libuv's, which `os.networkInterfaces()`
 *   reports as `errno: 24` and "Unknown system error 24" (seen on Node 24.21), so the number is read either way.
 * - A connection to the engine the host could not open (those two, or no socket buffers, ENOBUFS/ENOMEM, or no local
 *   port, EADDRNOTAVAIL: connect(2), socket(2)): nothing of it is the engine's. A call so failed is the agent's
 *   (retryable on another node, never counted against the engine: engine.failed_calls_unhealthy), and a liveness
 *   probe so failed is no probe at all (a fault review saw an agent at its descriptor limit mark its sound engine
 *   failing and due for a restart).
 */

type Descriptors = "EMFILE" | "ENFILE"

/** What to raise, for a message that already says EMFILE or ENFILE (Node's own). */
const REMEDY: Readonly<Record<Descriptors, string>> = {
  EMFILE:
    "the agent's descriptor limit (ulimit -n) is too low; raise it (systemd LimitNOFILE, the container's nofile ulimit)",
  ENFILE: "the host's file table is full (sysctl fs.file-max)"
}

const WORDS: Readonly<Record<string, string>> = {
  EMFILE: `too many open files: ${REMEDY.EMFILE}`,
  ENFILE: `too many open files in the system: ${REMEDY.ENFILE}`,
  ENOBUFS: "the host has no buffer space for a socket",
  ENOMEM: "the host has no memory for a socket",
  EADDRNOTAVAIL: "the host has no local port free to connect from"
}

/** Their numbers (Linux include/uapi/asm-generic/errno-base.h, and BSD's sys/errno.h alike); no node:* here. */
const BY_ERRNO: ReadonlyMap<number, Descriptors> = new Map([
  [24, "EMFILE"],
  [23, "ENFILE"]
])

/** What ran out on the host, for a socket error code (a connection the host could not open); undefined for another. */
export const hostShortage = (code: string | undefined): string | undefined =>
  code === undefined ? undefined : WORDS[code]

/** EMFILE or ENFILE when `e` is a failure for the lack of a file descriptor; undefined otherwise. */
export const descriptorShortage = (e: unknown): Descriptors | undefined => {
  if (typeof e !== "object" || e === null) return undefined
  const { code, errno } = e as { code?: unknown; errno?: unknown }
  if (code === "EMFILE" || code === "ENFILE") return code
  return typeof errno === "number" ? BY_ERRNO.get(Math.abs(errno)) : undefined
}

/** What ran out and what to raise, for a message that names an operation first. */
export const descriptorAdvice = (shortage: Descriptors): string => `${shortage}: ${WORDS[shortage]}`

/** What to raise, for a message that already says EMFILE or ENFILE (Node's own). */
export const descriptorRemedy = (shortage: Descriptors): string => REMEDY[shortage]
