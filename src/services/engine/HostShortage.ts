/**
 * HostShortage: a connection to the engine that the agent's own host could not open (pure). The socket's error code
 * says so before anything reached the engine: the agent's open-file limit (EMFILE), the host's file table (ENFILE),
 * socket buffers (ENOBUFS, ENOMEM) or local ports (EADDRNOTAVAIL) ran out (connect(2), socket(2)). None of them says
 * anything of the engine: a call so failed is the agent's (retryable on another node, never counted against the
 * engine: engine.failed_calls_unhealthy), and a liveness probe so failed is no probe at all (a fault review saw an
 * agent at its descriptor limit mark its sound engine failing and due for a restart).
 */

const SHORTAGES: Readonly<Record<string, string>> = {
  EMFILE: "the agent's open-file limit is reached (RLIMIT_NOFILE: LimitNOFILE, the container's nofile)",
  ENFILE: "the host's open-file table is full",
  ENOBUFS: "the host has no buffer space for a socket",
  ENOMEM: "the host has no memory for a socket",
  EADDRNOTAVAIL: "the host has no local port free to connect from"
}

/** What ran out on the agent's host, in an operator's words, for a socket error code; undefined for any other. */
export const hostShortage = (code: string | undefined): string | undefined =>
  code === undefined ? undefined : SHORTAGES[code]
