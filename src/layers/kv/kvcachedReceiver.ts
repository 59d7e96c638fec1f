/**
 * A reference cgn-kvcached receiver: the contract's RPC server (services/kv/KvcachedRpc.ts) on a Unix socket,
 * applying records through ReceiverState. Optionally journaled: every Hello and applied record is appended
 * to an NDJSON file before it is acknowledged, and the journal is read back at start, so a receiver killed
 * mid-stream and restarted answers Hello with what it really applied and skips the agent's resends (each
 * record lands in the journal exactly once). Used by the tests and as a starting point for implementers.
 */
import * as fs from "node:fs"
import * as net from "node:net"
import { Effect, Layer } from "effect"
import { RpcSerialization, RpcServer } from "effect/rpc"
import { type ReceiverSink, ReceiverState, type RestoredStream } from "../../services/kv/KvcachedReceiver.ts"
import {
  type Applied,
  type HelloPayload,
  KvcachedRpcs,
  type KvRecord,
  type PushPayload,
  type UnknownStream,
  type UnsupportedVersion
} from "../../services/kv/KvcachedRpc.ts"
import * as ReceiverSocketServer from "./receiverSocketServer.ts"

/** One journal line: a Hello, or a record applied for a node's epoch. */
export type JournalEntry =
  | { readonly hello: HelloPayload }
  | { readonly node_id: string; readonly epoch: string; readonly record: KvRecord }

/** Every entry of a journal file (none when it does not exist); a torn last line is ignored. */
export const readJournal = (file: string): Array<JournalEntry> => {
  let text: string
  try {
    text = fs.readFileSync(file, "utf8")
  } catch {
    return []
  }
  const out: Array<JournalEntry> = []
  for (const line of text.split("\n")) {
    if (line === "") continue
    try {
      out.push(JSON.parse(line) as JournalEntry)
    } catch {
      // a line cut short by a kill: it was never acknowledged
    }
  }
  return out
}

/** What a journal says each node's stream had applied. */
export const restoreFrom = (entries: ReadonlyArray<JournalEntry>): Array<RestoredStream> => {
  const streams = new Map<string, { epoch: string; applied: number | null }>()
  for (const e of entries) {
    if ("hello" in e) {
      const s = streams.get(e.hello.node_id)
      if (s === undefined || s.epoch !== e.hello.epoch)
        streams.set(e.hello.node_id, { epoch: e.hello.epoch, applied: null })
    } else {
      const s = streams.get(e.node_id)
      if (s !== undefined && s.epoch === e.epoch) s.applied = e.record.n
    }
  }
  return [...streams].map(([node_id, s]) => ({ node_id, ...s }))
}

/** A sink appending to `file` synchronously (the entry is in the kernel before the ack is written). */
export const journalSink = (file: string): ReceiverSink => {
  const fd = fs.openSync(file, "a")
  const append = (e: JournalEntry) => fs.writeSync(fd, `${JSON.stringify(e)}\n`)
  return {
    onHello: (hello) => append({ hello }),
    onRecord: (node_id, epoch, record) => append({ node_id, epoch, record })
  }
}

/**
 * Removes a socket file no one listens on (left by a killed receiver); fails if a receiver is live there, or if the
 * probe gets no answer within 5 s. The probe socket is closed however the check ends.
 */
const clearStaleSocket = (path: string) =>
  Effect.callback<void, Error>((resume) => {
    const probe = net.createConnection(path)
    probe.once("connect", () => {
      probe.destroy()
      resume(Effect.fail(new Error(`${path}: another receiver is listening`)))
    })
    probe.once("error", () => {
      fs.rmSync(path, { force: true })
      resume(Effect.void)
    })
    return Effect.sync(() => probe.destroy())
  }).pipe(
    Effect.timeoutOrElse({
      duration: "5 seconds",
      orElse: () => Effect.fail(new Error(`${path}: a socket there did not answer a connection within 5 s`))
    })
  )

export interface ReceiverOptions {
  readonly path: string
  /** Journal file (durable dedup across restarts); without it, `sink` only and state is in memory. */
  readonly journal?: string
  readonly sink?: ReceiverSink
}

/** The receiver's RPC server, listening on `path` while the layer lives. */
export const layer = (o: ReceiverOptions) =>
  Layer.unwrap(
    Effect.gen(function* () {
      yield* clearStaleSocket(o.path)
      const restored = o.journal === undefined ? [] : restoreFrom(readJournal(o.journal))
      const journal = o.journal === undefined ? undefined : journalSink(o.journal)
      const sink: ReceiverSink = {
        onHello: (h, fresh) => {
          journal?.onHello(h, fresh)
          o.sink?.onHello(h, fresh)
        },
        onRecord: (node, epoch, r) => {
          journal?.onRecord(node, epoch, r)
          o.sink?.onRecord(node, epoch, r)
        }
      }
      const state = new ReceiverState(sink, restored)
      return serve(o.path, { Hello: (h) => state.hello(h), Push: (p) => state.push(p) })
    })
  )

/** What a receiver answers; the reference receiver's come from ReceiverState. */
export interface KvcachedHandlers {
  readonly Hello: (h: HelloPayload) => Effect.Effect<Applied, UnsupportedVersion>
  readonly Push: (p: PushPayload) => Effect.Effect<Applied, UnknownStream>
}

/**
 * The contract's RPC server on the Unix socket `path`, answering with `handlers` (tests give odd ones). Its socket
 * server's writes to a closed connection fail instead of hanging, a peer's dropped connection is no error, and `path`
 * is removed at the end only while it is still this server's: see receiverSocketServer.ts.
 */
export const serve = (path: string, handlers: KvcachedHandlers) =>
  RpcServer.layer(KvcachedRpcs).pipe(
    Layer.provide(KvcachedRpcs.toLayer(handlers)),
    Layer.provide(RpcServer.layerProtocolSocketServer),
    Layer.provide(ReceiverSocketServer.layer(path)),
    Layer.provide(RpcSerialization.layerNdjson)
  )
