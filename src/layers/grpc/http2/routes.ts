/**
 * The gRPC server's routes (Server.ts): each method path's kind, definition and handler as grpc-js's
 * `Server.addService` takes them, and how a call is handed to its handler.
 */
import type * as grpc from "@grpc/grpc-js"
import { AgentDefect } from "../../../services/grpc/CallErrors.ts"
import { handlerFailure, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import type { ServerCall, UnaryCallback } from "./Call.ts"

export type Kind = "unary" | "serverStream" | "clientStream" | "bidi"

export interface Route {
  readonly kind: Kind
  readonly definition: grpc.MethodDefinition<unknown, unknown>
  readonly handler: (...args: Array<unknown>) => void
}

/** The route of each method of `service` that `implementation` implements. */
export const routesOf = (
  service: grpc.ServiceDefinition,
  implementation: grpc.UntypedServiceImplementation
): ReadonlyArray<Route> => {
  const routes: Array<Route> = []
  for (const name in service) {
    const definition = service[name] as grpc.MethodDefinition<unknown, unknown>
    const handler = implementation[name] ?? implementation[definition.originalName ?? ""]
    if (handler === undefined) continue
    const kind: Kind = definition.requestStream
      ? definition.responseStream
        ? "bidi"
        : "clientStream"
      : definition.responseStream
        ? "serverStream"
        : "unary"
    routes.push({ kind, definition, handler: handler as Route["handler"] })
  }
  return routes
}

/** Hands `call` to its route's handler: streaming handlers take the call, unary ones a callback too. */
export const runRoute = (route: Route, call: ServerCall<unknown, unknown>): void => {
  try {
    if (route.kind === "serverStream" || route.kind === "bidi") {
      route.handler(call)
      return
    }
    const done: UnaryCallback = (error, value) => {
      if (error !== null && error !== undefined) call.sendStatus(handlerFailure(error))
      else {
        call.write(value)
        call.end()
      }
    }
    route.handler(call, done)
  } catch (e) {
    // A handler that throws is a bug in the agent: the call ends INTERNAL, the server goes on.
    call.sendStatus(toGrpcFailure(new AgentDefect({ detail: e instanceof Error ? e.message : String(e) })))
  }
}
