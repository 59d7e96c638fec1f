/**
 * Client-side TLS for gRPC channels: credentials from material in memory (tests) or from the `generate`
 * client's `--tls-ca`, `--tls-cert`, `--tls-key` files, checked like the server's. No CA and no client
 * pair: plaintext.
 */
import { ChannelCredentials } from "@grpc/grpc-js"
import { Clock, Effect } from "effect"
import { TlsError, type TlsMaterial } from "../../services/tls/Tls.ts"
import { parseCaBundle, readMaterial, readOne } from "./tlsMaterial.ts"

/** Client credentials: TLS trusting `ca`, presenting `cert`/`key` when given; plaintext without `ca`. */
export const clientCredentials = (material?: Partial<TlsMaterial>): ChannelCredentials =>
  material?.ca === undefined
    ? ChannelCredentials.createInsecure()
    : ChannelCredentials.createSsl(material.ca, material.key ?? null, material.cert ?? null)

export interface ClientTlsFiles {
  readonly caFile?: string | undefined
  readonly certFile?: string | undefined
  readonly keyFile?: string | undefined
}

/**
 * Client credentials from files (the `generate` client's `--tls-ca`, `--tls-cert`, `--tls-key`). No files:
 * plaintext. A cert without a key (or the reverse) is an error naming the flag.
 */
export const loadClientCredentials = (
  files: ClientTlsFiles,
  keys: { readonly ca: string; readonly cert: string; readonly key: string } = {
    ca: "--tls-ca",
    cert: "--tls-cert",
    key: "--tls-key"
  }
): Effect.Effect<ChannelCredentials, TlsError> =>
  Effect.gen(function* () {
    if (files.caFile === undefined && files.certFile === undefined && files.keyFile === undefined) {
      return ChannelCredentials.createInsecure()
    }
    if ((files.certFile === undefined) !== (files.keyFile === undefined)) {
      const missing = files.certFile === undefined ? keys.cert : keys.key
      return yield* new TlsError({
        key: missing,
        reason: `required together with ${missing === keys.cert ? keys.key : keys.cert}`
      })
    }
    const caFile = files.caFile
    if (files.certFile === undefined || files.keyFile === undefined) {
      const ca = yield* readOne({ key: keys.ca, path: caFile })
      yield* parseCaBundle(ca, { key: keys.ca, path: caFile }, yield* Clock.currentTimeMillis)
      return clientCredentials({ ca })
    }
    if (caFile === undefined) {
      // No CA given: trust the system roots, still presenting the client certificate.
      const [cert, key] = yield* Effect.all([
        readOne({ key: keys.cert, path: files.certFile }),
        readOne({ key: keys.key, path: files.keyFile })
      ])
      return ChannelCredentials.createSsl(null, key, cert)
    }
    const material = yield* readMaterial(
      {
        ca: { key: keys.ca, path: caFile },
        cert: { key: keys.cert, path: files.certFile },
        key: { key: keys.key, path: files.keyFile }
      },
      "clientAuth"
    )
    return clientCredentials(material)
  })
