/**
 * The admin server's Host check, on every path (probes and 404s too) and before the method table and the auth
 * gate: while the server listens on loopback, a request whose Host names anything else is a DNS-rebinding page
 * (services/admin/HostHeader.ts) and is answered `421 Misdirected Request` (RFC 9110 §15.5.20: this server will
 * not answer for the name the request was sent to), with the reason as plain JSON and nothing done. 421, not
 * 403: the request is refused for where it was addressed, not for who sent it (403 is the web-page and token
 * refusals' code), and a client that meant the agent learns to use 127.0.0.1 or localhost.
 * Only installed on a loopback bind: off loopback the token guards the levers and the Host is whatever name or
 * address reaches the node (the kubelet's liveness probe sends the pod IP, Prometheus the target's address).
 */
import { Effect } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { hostAllowedOnLoopback, misdirectedReason } from "../../services/admin/HostHeader.ts"
import { refuse } from "./answer.ts"

export const loopbackHostCheck = HttpRouter.middleware(
  (httpEffect) =>
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
      const host = request.headers.host
      return hostAllowedOnLoopback(host)
        ? httpEffect
        : Effect.succeed(refuse("MisdirectedHost", misdirectedReason(host ?? "")))
    }),
  { global: true }
)
