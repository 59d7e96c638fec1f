/**
 * HealthReporter: keeps this node's NodeHealth in etcd at `${etcd_prefix}/${cluster}/nodes/${node_id}`
 * under a lease (register, heartbeat, recover, revoke). Owns the registration status shown in /status
 * and metrics, and the typed errors of registration. The live layer is layers/registry/HealthReporter.ts.
 * Nothing else waits on the reporter: when etcd is away the agent keeps serving and the reporter retries.
 */
import { Context, type Effect, Schema } from "effect"
import type { NodeHealth } from "../../gen/cgn/agent/v1/agent.ts"

/**
 * - standalone: `[cluster].etcd` is empty; nothing is written.
 * - registering: a lease is being granted or the key created.
 * - registered: the key is ours and was written on the last heartbeat.
 * - retrying: etcd could not be reached (or answered an error); retrying with backoff.
 * - conflict: another live lease holds our node id; we retry, never overwrite.
 * - revoked: our lease expired or was revoked; a new lease (new epoch) is being granted.
 */
export const RegistrationStates = [
  "standalone",
  "registering",
  "registered",
  "retrying",
  "conflict",
  "revoked"
] as const
export type RegistrationState = (typeof RegistrationStates)[number]

/** Who holds our node id when registration is refused. */
export interface ConflictHolder {
  /** The holder's lease id, hex. */
  readonly lease: string
  /** The holder's advertised address, as found in its record ("" when unreadable). */
  readonly advertiseAddr: string
  /** The holder's epoch, as found in its record ("" when unreadable). */
  readonly epoch: string
}

export interface RegistrationStatus {
  readonly state: RegistrationState
  /** The etcd key, undefined when standalone. */
  readonly key: string | undefined
  /** Our current lease id (decimal, as etcd prints it), undefined without a lease. */
  readonly leaseId: string | undefined
  /** The current epoch (the lease id in hex), written into NodeHealth.freshness.epoch. */
  readonly epoch: string | undefined
  /** The TTL granted by etcd, in ms (undefined without a lease). */
  readonly leaseTtlMs: number | undefined
  /** Time since the current lease was granted. */
  readonly leaseAgeMs: number | undefined
  /** Time since etcd last confirmed the lease alive. */
  readonly sinceKeepAliveMs: number | undefined
  /** The sequence number of the last record written (0 before the first write). */
  readonly sequence: number
  /** RFC 3339 time of the last successful write. */
  readonly lastWriteAt: string | undefined
  /** The node state the node's key says: that of the last record written under the live lease;
   * undefined while the node has no key (before the first write, after its lease was lost or revoked). */
  readonly publishedState: string | undefined
  /** The last error, cleared by the next successful write. */
  readonly lastError: string | undefined
  /** Set while state is "conflict". */
  readonly conflict: ConflictHolder | undefined
  /** Counters since start, for metrics. */
  readonly writes: number
  readonly writeFailures: number
  readonly leasesGranted: number
  readonly leasesLost: number
}

/** The status of a reporter that writes nowhere ([cluster].etcd empty, or the in-memory test reporter). */
export const standaloneStatus: RegistrationStatus = {
  state: "standalone",
  key: undefined,
  leaseId: undefined,
  epoch: undefined,
  leaseTtlMs: undefined,
  leaseAgeMs: undefined,
  sinceKeepAliveMs: undefined,
  sequence: 0,
  lastWriteAt: undefined,
  publishedState: undefined,
  lastError: undefined,
  conflict: undefined,
  writes: 0,
  writeFailures: 0,
  leasesGranted: 0,
  leasesLost: 0
}

/** Our node id is held by another live lease: refused, never overwritten. */
export class RegistrationConflict extends Schema.TaggedError<RegistrationConflict>()("RegistrationConflict", {
  key: Schema.String,
  nodeId: Schema.String,
  holderLease: Schema.String,
  holderAdvertiseAddr: Schema.String,
  /** The holder advertises this node's own address: most likely this node's previous agent, killed before its revoke. */
  holderIsThisAddress: Schema.Boolean,
  /**
   * Why the holder's lease is not revoked as this node's previous agent's (layers/registry/leaseRecord.ts): the
   * lease recorded in agent.state_dir is another, there is none, or this agent keeps no record.
   */
  notRevoked: Schema.optional(Schema.String)
}) {
  override get message(): string {
    const addr = this.holderAdvertiseAddr === "" ? "unknown address" : `advertising ${this.holderAdvertiseAddr}`
    // A lease's expiry is not persisted: an etcd that restarts (or elects a new leader) gives every lease a full TTL
    // again (etcd-io/etcd lease/lessor.go, Promote; server/lease/lessor.go from 3.5), so the holder's key may outlive
    // its agent's last keepalive by more than agent.lease_ttl.
    if (this.holderIsThisAddress && this.holderLease !== "none")
      return `node id "${this.nodeId}" is still registered at ${this.key} under lease ${this.holderLease}, advertising this node's own address (${this.holderAdvertiseAddr}): most likely this node's previous agent, stopped without revoking its lease (killed, out of memory)${this.notRevoked === undefined ? "" : `; not revoked: an agent revokes only the lease its previous agent recorded in agent.state_dir, and ${this.notRevoked}`}; refusing to overwrite it, retrying until that lease ends (at most agent.lease_ttl after etcd last saw it kept alive; an etcd restart extends it). If another agent at this address runs with this id, give one of them a distinct [agent].node_id`
    // A key written without a lease (by hand, by a tool) never expires: only its removal ends the conflict.
    if (this.holderLease === "none")
      return `node id "${this.nodeId}" is already registered at ${this.key} with no lease (${addr}): written by hand or by another tool, it never expires; refusing to overwrite it, retrying until the key is deleted (etcdctl del ${this.key}). If another agent needs this id, give this one a distinct [agent].node_id`
    return `node id "${this.nodeId}" is already registered at ${this.key} by another live agent (lease ${this.holderLease}, ${addr}); refusing to overwrite it, retrying until that lease ends. Give this agent a distinct [agent].node_id`
  }
}

/** etcd did not answer, or answered an error, for one operation. */
export class EtcdUnavailable extends Schema.TaggedError<EtcdUnavailable>()("EtcdUnavailable", {
  operation: Schema.String,
  reason: Schema.String,
  /** etcd answered, refusing it (e.g. RESOURCE_EXHAUSTED over its space quota), rather than not answering at all. */
  answered: Schema.optional(Schema.Boolean)
}) {
  override get message(): string {
    return `etcd ${this.operation} failed: ${this.reason}`
  }
}

/** Our lease is gone (expired or revoked from outside); the reporter grants a new one. */
export class LeaseLost extends Schema.TaggedError<LeaseLost>()("LeaseLost", {
  leaseId: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    // in hex, as epochs and `etcdctl lease list` show lease ids (the id itself is etcd's decimal)
    return `etcd lease ${/^\d+$/.test(this.leaseId) ? epochOf(this.leaseId) : "(unknown)"} lost: ${this.reason}`
  }
}

/**
 * A TLS file named in [cluster] cannot be read, or (`unusable`) was read and cannot be used: not PEM, expired or not
 * yet valid, a key of another certificate. Fails the layer at start, like a config error.
 */
export class EtcdTlsError extends Schema.TaggedError<EtcdTlsError>()("EtcdTlsError", {
  key: Schema.String,
  file: Schema.String,
  reason: Schema.String,
  unusable: Schema.optionalKey(Schema.Boolean)
}) {
  override get message(): string {
    // an unusable file in [security]'s words (layers/tls/tlsMaterial.ts): `key (path): reason`
    return this.unusable === true
      ? `cluster.${this.key} (${this.file}): ${this.reason}`
      : `cluster.${this.key}: cannot read ${this.file}: ${this.reason}`
  }
}

export type ReporterError = RegistrationConflict | EtcdUnavailable | LeaseLost

export interface HealthReporterService {
  /** The registration status now. */
  readonly status: Effect.Effect<RegistrationStatus>
  /** The last record written to etcd (with freshness), undefined before the first write or when standalone. */
  readonly lastRecord: Effect.Effect<NodeHealth | undefined>
  /**
   * Publishes state=draining at once and keeps it for the rest of the process.
   * Fails when the write did not reach etcd; the heartbeat keeps retrying it either way.
   */
  readonly markDraining: Effect.Effect<void, ReporterError>
  /** Writes the current NodeHealth at once (registering first if needed). No-op when standalone. */
  readonly flush: Effect.Effect<void, ReporterError>
  /**
   * SIGHUP: reads the [cluster] etcd TLS files again and, when they changed, talks to etcd with them from then on
   * (a rotated client certificate, a new CA bundle); logs what it did, never fails. No-op without etcd TLS files.
   * Its result: the problem it warned of (undefined when none), for the SIGHUP's other lines not to repeat it.
   */
  readonly reloadTls: Effect.Effect<string | undefined>
}

export class HealthReporter extends Context.Service<HealthReporter, HealthReporterService>()(
  "cgn-agent/HealthReporter"
) {}

/** The etcd key of a node's record. */
export const nodeKey = (prefix: string, cluster: string, nodeId: string): string =>
  `${prefix.replace(/\/+$/, "")}/${cluster}/nodes/${nodeId}`

/** The etcd prefix a router watches for every node of a cluster. */
export const nodesPrefix = (prefix: string, cluster: string): string =>
  `${prefix.replace(/\/+$/, "")}/${cluster}/nodes/`

/**
 * The epoch of a lease: its id in lowercase hex, 16 digits as etcdctl prints it (`%016x`), so an operator's
 * `etcdctl lease list` matches it as text (etcd's JSON gives ids in decimal).
 */
export const epochOf = (leaseId: string): string => BigInt(leaseId).toString(16).padStart(16, "0")
