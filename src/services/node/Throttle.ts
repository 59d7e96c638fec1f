// The GPU's clock throttle reasons, from NVML's bit mask (pure; loaded by the NVML worker too: no effect, no node:*).
/**
 * nvml.h `nvmlClocksEventReason*` bits (formerly `nvmlClocksThrottleReason*`), in snake_case. GpuIdle (0x1) is
 * left out on purpose: an idle GPU clocking down is not a problem an operator needs to see.
 */
const THROTTLE_BITS: ReadonlyArray<readonly [bigint, string]> = [
  [0x2n, "applications_clocks_setting"],
  [0x4n, "sw_power_cap"],
  [0x8n, "hw_slowdown"],
  [0x10n, "sync_boost"],
  [0x20n, "sw_thermal_slowdown"],
  [0x40n, "hw_thermal_slowdown"],
  [0x80n, "hw_power_brake_slowdown"],
  [0x100n, "display_clock_setting"]
]

/** Every reason name this agent can report, for metrics that show each one as 0 or 1. */
export const throttleReasonNames: ReadonlyArray<string> = THROTTLE_BITS.map(([, name]) => name)

/** The active throttle reasons of an NVML bit mask (number or bigint, as koffi hands a 64-bit value). */
export const throttleReasons = (mask: number | bigint): ReadonlyArray<string> => {
  const bits = BigInt(mask)
  return THROTTLE_BITS.filter(([bit]) => (bits & bit) !== 0n).map(([, name]) => name)
}
