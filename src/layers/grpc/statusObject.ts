/**
 * A GrpcFailure (services/grpc/GrpcStatus.ts: the table's answer) as the status object grpc-js sends when a
 * handler emits it as 'error' or passes it to a unary callback: code, message and the `cgn-*` trailers.
 */
import * as grpc from "@grpc/grpc-js"
import type { GenerateError } from "../../services/grpc/GrpcStatus.ts"
import { type GrpcFailure, toGrpcFailure } from "../../services/grpc/GrpcStatus.ts"

export const statusObject = (f: GrpcFailure): Partial<grpc.StatusObject> => {
  const metadata = new grpc.Metadata()
  for (const k in f.trailers) metadata.set(k, f.trailers[k]!)
  return { code: f.code, details: f.message, metadata }
}

/** The status object for an error, through the one table. */
export const statusOfError = (e: GenerateError): Partial<grpc.StatusObject> => statusObject(toGrpcFailure(e))
