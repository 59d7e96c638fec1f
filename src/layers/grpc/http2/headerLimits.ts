/**
 * How much request metadata (HTTP/2 header fields) the agent's gRPC server takes: a limit on bytes, counted as
 * HTTP/2's SETTINGS_MAX_HEADER_LIST_SIZE counts them (each field's name and value plus 32), as gRPC asks
 * (grpc/grpc doc/PROTOCOL-HTTP2.md, "Servers may limit the size of Request-Headers"), never on a field count.
 *
 * Node's own default was a count: `maxHeaderListPairs` 128 fields, pseudo-headers included, past which Node
 * resets the stream (ENHANCE_YOUR_CALM) before the server sees it, so a router's call with 125 metadata entries
 * failed, as RESOURCE_EXHAUSTED "Bandwidth exhausted" in grpc-js, with nothing logged or counted by the agent.
 * Node neither sends nor enforces a byte limit by default (measured on Node 24: a 200 KB header list is
 * taken; nodejs/node src/node_http2.cc Http2Stream::AddHeader caps it at the local SETTINGS value).
 *
 * The byte limit is 64 KiB: 8x what gRPC suggests and 4x grpc C-core's hard limit (16 KiB,
 * src/core/call/metadata_info.h DEFAULT_MAX_HEADER_LIST_SIZE, refused RESOURCE_EXHAUSTED in
 * src/core/ext/transport/chttp2/transport/hpack_parse_result.cc); grpc-go takes 16 MiB
 * (internal/transport/defaults.go defaultServerMaxHeaderListSize), which nghttp2 under Node cannot: it closes
 * the whole connection on a field longer than 64 KiB encoded (COMPRESSION_ERROR) or a header block in more than
 * 9 frames (~144 KiB; "Too many CONTINUATION frames", its CVE-2024-27316 guard). 64 KiB is the most that no list
 * within the limit can reach either, so a client that keeps to the advertised limit never ends the connection.
 *
 * The limit holds from the client's acknowledgement of the server's SETTINGS on (nghttp2 applies a local setting
 * once it is acknowledged, RFC 9113 section 6.5.3): a request in a connection's first flight, sent before that,
 * is taken whatever its size (measured: a raw client's first call with 80 KB of metadata served, the same call
 * next on that connection reset; grpc-js waits for the server's SETTINGS, so its first call is refused too). Such
 * a list is still bounded by nghttp2's own limits above (~144 KiB).
 *
 * Past it Node resets that one stream with ENHANCE_YOUR_CALM, which gRPC maps to RESOURCE_EXHAUSTED
 * (PROTOCOL-HTTP2.md "Errors"; grpc-js src/subchannel-call.ts, grpc-go internal/transport/http_util.go). The limit
 * goes to the client in SETTINGS, and grpc-go's client checks it before sending: the call fails there, INTERNAL
 * "header list size to send violates the maximum size (65536 bytes) set by server"
 * (internal/transport/http2_client.go), nothing sent.
 */

/** SETTINGS_MAX_HEADER_LIST_SIZE the server advertises and Node enforces per request (bytes). */
export const MAX_HEADER_LIST_BYTES = 64 * 1024

/**
 * Node's field count, set so that it never decides before the byte limit: each field counts at least 32 bytes
 * there, so no list within MAX_HEADER_LIST_BYTES has more fields than this.
 */
export const MAX_HEADER_LIST_PAIRS = MAX_HEADER_LIST_BYTES / 32
