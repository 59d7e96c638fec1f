/**
 * grpc-js's way to change server certificates after bind: a CertificateProvider whose listeners the
 * server registers, each update reaching the HTTP/2 server's `setSecureContext`. Uses grpc-js's public
 * `experimental` namespace only.
 */
import type { experimental } from "@grpc/grpc-js"
import type { TlsMaterial } from "../../services/tls/Tls.ts"

/**
 * A grpc-js CertificateProvider for both roles (CA and identity), pushing each new material to the listeners.
 * Used as both providers, so the order of createCertificateProviderServerCredentials' arguments (whose
 * declared names and implementation disagree in 1.14) does not matter.
 */
export class ReloadableProvider implements experimental.CertificateProvider {
  #material: TlsMaterial
  readonly #ca = new Set<experimental.CaCertificateUpdateListener>()
  readonly #identity = new Set<experimental.IdentityCertificateUpdateListener>()
  constructor(material: TlsMaterial) {
    this.#material = material
  }
  update(material: TlsMaterial): void {
    this.#material = material
    for (const l of this.#ca) l({ caCertificate: material.ca })
    for (const l of this.#identity) l({ certificate: material.cert, privateKey: material.key })
  }
  // grpc-js reads no initial options: it expects the current material pushed once a listener is added, and on
  // the next tick, because it registers the server's own watcher only after adding these listeners.
  addCaCertificateListener(l: experimental.CaCertificateUpdateListener): void {
    this.#ca.add(l)
    const material = this.#material
    process.nextTick(() => this.#ca.has(l) && l({ caCertificate: material.ca }))
  }
  removeCaCertificateListener(l: experimental.CaCertificateUpdateListener): void {
    this.#ca.delete(l)
  }
  addIdentityCertificateListener(l: experimental.IdentityCertificateUpdateListener): void {
    this.#identity.add(l)
    const material = this.#material
    process.nextTick(() => this.#identity.has(l) && l({ certificate: material.cert, privateKey: material.key }))
  }
  removeIdentityCertificateListener(l: experimental.IdentityCertificateUpdateListener): void {
    this.#identity.delete(l)
  }
}
