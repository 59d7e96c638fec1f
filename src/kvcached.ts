/**
 * `cgn-agent/kvcached`: what a cgn-kvcached implementation imports. The contract (the RPC group and its
 * schemas, wire version 2), the receiver's pure state machine (dedup by link seq), and the reference
 * receiver layer (effect RPC server on a Unix socket, optionally journaled). README section `kv` is the spec.
 */
export * from "./layers/kv/kvcachedReceiver.ts"
export * from "./services/kv/KvcachedReceiver.ts"
export * from "./services/kv/KvcachedRpc.ts"
