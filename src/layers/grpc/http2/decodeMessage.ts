/**
 * One gRPC request message as its method's request type: decompressed when flagged (gzip, deflate) within the
 * message limit, then deserialized. Each failure is the transport error its status comes from (GrpcStatus.ts).
 */
import * as zlib from "node:zlib"
import { type GrpcFailure, toGrpcFailure } from "../../../services/grpc/GrpcStatus.ts"
import {
  MessageTooLarge,
  ProtocolViolation,
  type TransportError,
  UndecodableRequest,
  UnsupportedEncoding
} from "../../../services/grpc/TransportErrors.ts"
import type { WireMessage } from "../../../services/grpc/Wire.ts"

export interface Decoder {
  readonly path: string
  /** The request's grpc-encoding. */
  readonly encoding: string
  readonly limit: number
  readonly deserialize: (bytes: Buffer) => unknown
}

export type Decoded =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly failure: GrpcFailure }

const fail = (e: TransportError): Decoded => ({ ok: false, failure: toGrpcFailure(e) })

/** One message's body, decompressed when it is flagged compressed (gzip, deflate), within the limit. */
const inflate = (d: Decoder, m: WireMessage): Buffer | Decoded => {
  if (!m.compressed) return Buffer.from(m.body.buffer, m.body.byteOffset, m.body.byteLength)
  if (d.encoding === "identity")
    return fail(new ProtocolViolation({ detail: "compressed message with grpc-encoding identity" }))
  if (d.encoding !== "gzip" && d.encoding !== "deflate") return fail(new UnsupportedEncoding({ encoding: d.encoding }))
  try {
    // maxOutputLength stops a small compressed message from inflating past the limit in memory.
    const body = (d.encoding === "gzip" ? zlib.gunzipSync : zlib.inflateSync)(m.body, { maxOutputLength: d.limit + 1 })
    return body.length > d.limit ? fail(new MessageTooLarge({ length: body.length, limit: d.limit })) : body
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE") {
      return fail(new MessageTooLarge({ length: d.limit + 1, limit: d.limit }))
    }
    return fail(
      new ProtocolViolation({ detail: `cannot decompress the ${d.encoding} message: ${(e as Error).message}` })
    )
  }
}

/** One message as the method's request type. */
export const decode = (d: Decoder, m: WireMessage): Decoded => {
  const body = inflate(d, m)
  if (!Buffer.isBuffer(body)) return body
  try {
    return { ok: true, value: d.deserialize(body) }
  } catch (e) {
    return fail(new UndecodableRequest({ method: d.path, detail: (e as Error).message }))
  }
}
