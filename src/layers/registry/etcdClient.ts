/**
 * The few etcd operations the HealthReporter needs, as Effects with typed errors, over one etcd3 client
 * built from [cluster] (hosts, TLS, user/password). Every call has a deadline, etcd3's own retry and
 * circuit-breaker policies are replaced by faultPolicies.ts (the reporter owns backoff; a dead endpoint among
 * several is skipped), and grpc-js reconnect backoff is capped likewise.
 */
import * as fs from "node:fs/promises"
import { Clock, Effect, type Scope } from "effect"
import type { IKeyValue, IOptions } from "etcd3"
import type { AgentConfig } from "../../services/config/Config.ts"
import { EtcdTlsError, EtcdUnavailable, LeaseLost } from "../../services/registry/HealthReporter.ts"
import type { TlsError } from "../../services/tls/Tls.ts"
import { checkKeyPair, parseCaBundle, type TlsFiles } from "../tls/tlsMaterial.ts"
import { answeredBy, etcdAuthSays, makeFailureReasons, reasonOf as messageOf } from "./etcdErrors.ts"
import { makeHostFailover, passThrough } from "./faultPolicies.ts"
import { keepAliveOnce } from "./leaseKeepAlive.ts"

export interface Granted {
  readonly id: string
  readonly ttlMs: number
}

/** What holds the key when it is not ours. */
export interface Holder {
  readonly lease: string
  readonly value: string
}

export type WriteOutcome =
  | { readonly _tag: "Written" }
  | { readonly _tag: "Missing" }
  | { readonly _tag: "Held"; readonly holder: Holder }

export interface EtcdOps {
  readonly grant: (ttlSeconds: number) => Effect.Effect<Granted, EtcdUnavailable>
  /** One keepalive round trip; LeaseLost when etcd answers TTL 0 (expired or revoked). */
  readonly keepAlive: (leaseId: string) => Effect.Effect<number, EtcdUnavailable | LeaseLost>
  /** Creates the key under our lease if absent (createRevision == 0), or rewrites it if it is already ours. */
  readonly create: (
    key: string,
    value: string,
    leaseId: string
  ) => Effect.Effect<WriteOutcome, EtcdUnavailable | LeaseLost>
  /** Rewrites the key only while it is still attached to our lease. */
  readonly write: (
    key: string,
    value: string,
    leaseId: string
  ) => Effect.Effect<WriteOutcome, EtcdUnavailable | LeaseLost>
  readonly revoke: (leaseId: string) => Effect.Effect<void, EtcdUnavailable>
  /**
   * Reads the [cluster] TLS files again; when they changed, the next calls go through a new client with them (the
   * lease and key are etcd's, so nothing is re-registered). False when unchanged. A bad file fails and changes nothing.
   */
  readonly reloadTls: Effect.Effect<boolean, EtcdTlsError>
}

export interface EtcdClientOptions {
  /** Deadline of one call. */
  readonly callTimeoutMs: number
  /** Cap of grpc-js reconnect backoff. */
  readonly reconnectCapMs: number
}

/**
 * What every call may take past its gRPC deadline before it fails here anyway ("timed out"): one etcd call is
 * bounded by `callTimeoutMs` + this, whatever grpc-js does (programs/shutdownBound.ts counts on it).
 */
export const CALL_DEADLINE_SLACK_MS = 500

/** The [cluster] TLS files' keys. */
type EtcdTlsKey = "etcd_ca_file" | "etcd_cert_file" | "etcd_key_file"

/**
 * One [cluster] TLS file's bytes, undefined when unset; an unreadable file fails naming its key. `check` reads each
 * on its own first (programs/check.ts preflight), so every unreadable file is a line of its own, as [security]'s are.
 */
export const readEtcdTls = (
  cluster: AgentConfig["cluster"],
  key: EtcdTlsKey
): Effect.Effect<Buffer | undefined, EtcdTlsError> => {
  const file = cluster[key]
  return file === undefined
    ? Effect.succeed(undefined)
    : Effect.tryPromise({
        try: () => fs.readFile(file),
        catch: (e) => new EtcdTlsError({ key, file, reason: messageOf(e) })
      })
}

/** The [cluster] TLS files as tlsMaterial.ts names them in its errors (`cluster.etcd_ca_file (path): reason`). */
export const etcdTlsFiles = (cluster: AgentConfig["cluster"]): TlsFiles => ({
  ca: { key: "cluster.etcd_ca_file", path: cluster.etcd_ca_file },
  cert: { key: "cluster.etcd_cert_file", path: cluster.etcd_cert_file },
  key: { key: "cluster.etcd_key_file", path: cluster.etcd_key_file }
})

/** Checks the PEM material now as [security]'s is (tlsMaterial.ts), so a bad file fails at start and in `check`. */
const checkTls = (
  cluster: AgentConfig["cluster"],
  ca: Buffer | undefined,
  cert: Buffer | undefined,
  key: Buffer | undefined
): Effect.Effect<void, EtcdTlsError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const files = etcdTlsFiles(cluster)
    // Node's secure context silently skips a CA bundle without certificates; parseCaBundle does not.
    if (ca !== undefined) yield* parseCaBundle(ca, files.ca, now)
    // Half a client pair is refused by the config decoder (src/layers/config/crossChecks.ts), so both or neither here.
    if (cert !== undefined && key !== undefined) yield* checkKeyPair({ ca, cert, key }, files, now)
  }).pipe(
    Effect.mapError(
      (e: TlsError) =>
        new EtcdTlsError({ key: e.key.replace(/^cluster\./, ""), file: e.path ?? "", reason: e.reason, unusable: true })
    )
  )

/** The etcd3 options for [cluster]; reads the TLS files. */
export const etcdOptions = Effect.fnUntraced(function* (
  cluster: AgentConfig["cluster"],
  options: EtcdClientOptions
): Effect.fn.Return<IOptions, EtcdTlsError> {
  const ca = yield* readEtcdTls(cluster, "etcd_ca_file")
  const cert = yield* readEtcdTls(cluster, "etcd_cert_file")
  const key = yield* readEtcdTls(cluster, "etcd_key_file")
  yield* checkTls(cluster, ca, cert, key)
  const useTls = ca !== undefined || cert !== undefined
  const result: IOptions = {
    // https:// hosts without any TLS file use the system roots (etcd3 does that itself).
    hosts: [...cluster.etcd],
    ...(useTls
      ? {
          credentials: {
            // null: grpc-js uses the system roots (a client pair with a publicly signed server)
            rootCertificate: ca ?? (null as unknown as Buffer),
            ...(key !== undefined ? { privateKey: key } : {}),
            ...(cert !== undefined ? { certChain: cert } : {})
          }
        }
      : {}),
    ...(cluster.etcd_username !== undefined && cluster.etcd_password !== undefined
      ? { auth: { username: cluster.etcd_username, password: cluster.etcd_password } }
      : {}),
    grpcOptions: {
      "grpc.initial_reconnect_backoff_ms": Math.min(100, options.reconnectCapMs),
      "grpc.max_reconnect_backoff_ms": options.reconnectCapMs,
      // Not a backoff: the deadline of one connection attempt (TCP, TLS, the server's SETTINGS). grpc-js
      // ignores it, but nice-grpc, loaded in this process, patches every grpc-js channel to read it as gRPC's
      // MIN_CONNECT_TIMEOUT (nice-grpc lib/client/connectTimeoutPatch.js). At 100 ms an etcd a few round
      // trips away never connected; a call's own deadline lets a slow one in and still fails a dead one.
      "grpc.min_reconnect_backoff_ms": options.callTimeoutMs
    },
    // a gRPC deadline is a wall-clock instant (grpc-js reads it against Date.now), taken when grpc-js starts the call
    defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + options.callTimeoutMs })
  }
  return result
})

const keyValue = (kvs: ReadonlyArray<IKeyValue> | undefined): Holder | undefined => {
  const kv = kvs?.[0]
  return kv === undefined ? undefined : { lease: kv.lease, value: kv.value.toString("utf8") }
}

/** The etcd client of the reporter, closed with the scope. */
export const makeEtcdOps = Effect.fnUntraced(function* (
  cluster: AgentConfig["cluster"],
  options: EtcdClientOptions
): Effect.fn.Return<EtcdOps, EtcdTlsError, Scope.Scope> {
  const opts = yield* etcdOptions(cluster, options)
  // Loaded here, not at start: a standalone agent ([cluster].etcd empty) never holds etcd3 and its grpc-js client.
  const etcd3 = yield* Effect.promise(() => import("etcd3"))
  const { Etcd3, EtcdLeaseInvalidError, isRecoverableError } = etcd3
  const answered = answeredBy(etcd3)
  const reasonOf = makeFailureReasons()
  const faultHandling = {
    host: makeHostFailover(cluster.etcd, (e) => isRecoverableError(e as Error)),
    global: passThrough()
  }
  // Replaced by reloadTls (a rotated client certificate is used only by connections made after the swap, and a
  // connection lives until etcd or the network drops it); the scope closes whichever client is current.
  // Without a token while etcd has auth off (etcdAuthSays): a client is built without the credentials then.
  let authOff = false
  let current = opts
  const build = () => {
    const { auth, ...rest } = current
    return new Etcd3({ ...rest, ...(authOff || auth === undefined ? {} : { auth }), faultHandling })
  }
  let client = build()
  yield* Effect.addFinalizer(() => Effect.sync(() => client.close()))
  // close() lets calls already in flight on the old client finish (a revoke, a write); new calls use the new one.
  const rebuild = () => {
    const old = client
    client = build()
    old.close()
  }
  const sameBytes = (a: Buffer | null | undefined, b: Buffer | null | undefined) =>
    a === b || (a != null && b != null && a.equals(b))
  const reloadTls = Effect.gen(function* () {
    const next = yield* etcdOptions(cluster, options)
    const [was, now] = [current.credentials, next.credentials]
    const unchanged =
      sameBytes(was?.rootCertificate, now?.rootCertificate) &&
      sameBytes(was?.certChain, now?.certChain) &&
      sameBytes(was?.privateKey, now?.privateKey)
    if (unchanged) return false
    current = next
    rebuild()
    return true
  })
  /** Follows etcd's auth (etcdAuthSays) on a failure; true when it switched, the client rebuilt. */
  const followAuth = (e: EtcdUnavailable | LeaseLost): Effect.Effect<boolean> => {
    const says = opts.auth === undefined || e._tag !== "EtcdUnavailable" ? undefined : etcdAuthSays(e.reason)
    if (says === undefined || (says === "off") === authOff) return Effect.succeed(false)
    authOff = says === "off"
    rebuild()
    return Effect.as(
      Effect.logWarning(
        authOff
          ? "etcd has authentication disabled: going on without a token (cluster.etcd_username is not used while it is off)"
          : "etcd has authentication enabled again: authenticating as cluster.etcd_username"
      ),
      true
    )
  }
  /**
   * A call refused for its auth alone is made once more on the client rebuilt for it, within the same deadline: the
   * refusal came before etcd ran anything (etcd3 asks for a token first, which an etcd with auth off refuses; an etcd
   * with auth on refuses a call without a token), so nothing runs twice. Left to the reporter's next round, the first
   * call of every start with etcd_username set against an etcd with auth off failed: a "retrying" warning and a
   * backoff before registering, for what the warning of the switch already says.
   */
  const followingAuth = <A>(
    attempt: Effect.Effect<A, EtcdUnavailable | LeaseLost>,
    operation: string
  ): Effect.Effect<A, EtcdUnavailable | LeaseLost> =>
    attempt.pipe(
      Effect.catch((e) => Effect.flatMap(followAuth(e), (switched) => (switched ? attempt : Effect.fail(e)))),
      // belt and braces: the gRPC deadline should fire first
      Effect.timeoutOrElse({
        duration: options.callTimeoutMs + CALL_DEADLINE_SLACK_MS,
        orElse: () => Effect.fail(new EtcdUnavailable({ operation, reason: "timed out" }))
      }),
      Effect.tapError(followAuth) // a retried call's own refusal: followed for the next call, not retried
    )
  const call = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, EtcdUnavailable | LeaseLost> =>
    followingAuth(
      Effect.tryPromise({
        try: f,
        catch: (e) =>
          e instanceof EtcdLeaseInvalidError
            ? new LeaseLost({ leaseId: "", reason: e.message })
            : new EtcdUnavailable({ operation, reason: reasonOf(e), answered: answered(e) })
      }),
      operation
    )
  const unavailableOnly = <A>(operation: string, f: () => Promise<A>) =>
    call(operation, f).pipe(
      Effect.catchTag("LeaseLost", (e) => Effect.fail(new EtcdUnavailable({ operation, reason: e.reason })))
    )
  const withLease = (leaseId: string) => (e: EtcdUnavailable | LeaseLost) =>
    e._tag === "LeaseLost" ? new LeaseLost({ leaseId, reason: e.reason }) : e

  const grant = (ttlSeconds: number) =>
    unavailableOnly("lease grant", () => client.leaseClient.leaseGrant({ TTL: ttlSeconds })).pipe(
      Effect.map((r) => ({ id: r.ID, ttlMs: Number(r.TTL) * 1000 }))
    )

  const keepAlive = (leaseId: string): Effect.Effect<number, EtcdUnavailable | LeaseLost> =>
    followingAuth(
      Effect.suspend(() => keepAliveOnce(client.leaseClient, leaseId, options.callTimeoutMs, reasonOf)),
      "lease keepalive"
    )

  const txn = (
    operation: string,
    key: string,
    compare: "absent" | "ours",
    value: string,
    leaseId: string
  ): Effect.Effect<WriteOutcome, EtcdUnavailable | LeaseLost> => {
    const k = Buffer.from(key)
    const cmp =
      compare === "absent"
        ? { key: k, target: "Create" as const, result: "Equal" as const, create_revision: 0 }
        : { key: k, target: "Lease" as const, result: "Equal" as const, lease: leaseId }
    return call(operation, () =>
      client.kv.txn({
        compare: [cmp],
        success: [{ request_put: { key: k, value: Buffer.from(value), lease: leaseId } }],
        failure: [{ request_range: { key: k } }]
      })
    ).pipe(
      Effect.mapError(withLease(leaseId)),
      Effect.map((r): WriteOutcome => {
        if (r.succeeded) return { _tag: "Written" }
        const holder = keyValue(r.responses[0]?.response_range?.kvs)
        return holder === undefined ? { _tag: "Missing" } : { _tag: "Held", holder }
      })
    )
  }

  const create = (key: string, value: string, leaseId: string) =>
    txn("create", key, "absent", value, leaseId).pipe(
      Effect.flatMap((o) =>
        // Already ours (a retried create whose answer was lost): rewrite it under the lease guard.
        o._tag === "Held" && o.holder.lease === leaseId ? txn("write", key, "ours", value, leaseId) : Effect.succeed(o)
      )
    )
  const write = (key: string, value: string, leaseId: string) => txn("write", key, "ours", value, leaseId)
  const revoke = (leaseId: string) =>
    call("lease revoke", () => client.leaseClient.leaseRevoke({ ID: leaseId })).pipe(
      Effect.asVoid,
      // already gone is what we wanted
      Effect.catchTag("LeaseLost", () => Effect.void)
    )

  return { grant, keepAlive, create, write, revoke, reloadTls } satisfies EtcdOps
})
