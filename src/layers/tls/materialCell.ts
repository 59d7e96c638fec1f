/**
 * The served TLS material as a cell: the gRPC server reads the current material when it starts listening and
 * subscribes to each change, which it applies with node:tls `setSecureContext` (new connections get the new
 * certificate; open ones keep theirs).
 */
import type { TlsMaterial, TlsSource } from "../../services/tls/Tls.ts"

export class MaterialCell implements TlsSource {
  #material: TlsMaterial
  readonly #listeners = new Set<(material: TlsMaterial) => void>()
  constructor(material: TlsMaterial) {
    this.#material = material
  }
  readonly current = (): TlsMaterial => this.#material
  readonly subscribe = (listener: (material: TlsMaterial) => void): (() => void) => {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }
  update(material: TlsMaterial): void {
    this.#material = material
    for (const l of this.#listeners) l(material)
  }
}
