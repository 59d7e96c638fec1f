/**
 * ClearXids: the pure part of `POST /gpus/clear-xids[?gpu=N|UUID]` (layers/admin/clearXidsRoute.ts), the operator's
 * word that a GPU was reset (nvidia-smi -r) and its Xids, kept for the boot (services/node/XidLedger.ts), no longer
 * make it faulty. Without `gpu`, every GPU's are cleared: after a reboot nothing is left to clear, and a reset of
 * every GPU is the common fix.
 */
import { Result } from "effect"
import type { GpuRef } from "../node/Gpus.ts"

export const CLEAR_XIDS_PATH = "/gpus/clear-xids"

/**
 * The GPU the query names (`gpu`: an NVML index, or a UUID as NVML reports it), undefined for every GPU; fails with
 * why. An unknown parameter is refused: `?gpus=1` must not quietly clear every GPU.
 */
export const parseClearXidsQuery = (search: string): Result.Result<GpuRef | undefined, string> => {
  const params = new URLSearchParams(search)
  for (const name of params.keys()) {
    if (name !== "gpu") return Result.fail(`unknown parameter ${JSON.stringify(name)}; the one known is gpu`)
  }
  const values = params.getAll("gpu")
  if (values.length === 0) return Result.succeed(undefined)
  if (values.length > 1) return Result.fail(`gpu given ${values.length} times; give it once`)
  const text = values[0]!
  if (/^\d{1,4}$/.test(text)) return Result.succeed(Number(text))
  // nvidia-smi -L prints them so: GPU-<uuid>
  if (/^GPU-[0-9A-Za-z-]{1,80}$/.test(text)) return Result.succeed(text)
  // NVML delivers Xids per physical GPU, and the agent keeps them so: a MIG instance's are its GPU's
  if (text.startsWith("MIG-")) return Result.fail("a MIG instance's Xids are its GPU's: give the GPU's index or UUID")
  return Result.fail(`gpu must be an NVML index or a GPU UUID (GPU-...), got ${JSON.stringify(text)}`)
}
