// models.<name>.gpus naming a MIG device: one MIG device alone, for one worker (CUDA enumerates one MIG device per
// process), refused at load with the key and the reason; the CLI's exit 2 is in test/engine/gpu-mig.test.ts.
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { decodeConfig } from "../../src/layers/config/Config.ts"

const problemsOf = (text: string): ReadonlyArray<string> => {
  const r = decodeConfig(text, "mig.toml", {})
  return Result.isFailure(r) ? r.failure.problems : []
}

const MODEL = '[models.m]\nhf_repo = "a/b"\n'
const A = "MIG-4b4ec5d8-0000-1111-2222-333333333333"
const B = "MIG-4b4ec5d8-0000-1111-2222-444444444444"
const ONE = "CUDA enumerates only one MIG device per process (NVIDIA MIG User Guide, CUDA device enumeration)"

describe("models.<name>.gpus with a MIG device", () => {
  it("one MIG device for one worker is accepted, also by its name before R470 (MIG-GPU-<uuid>/<gi>/<ci>)", () => {
    expect(problemsOf(`${MODEL}gpus = ["${A}"]\n`)).toEqual([])
    expect(problemsOf(`${MODEL}gpus = ["MIG-GPU-4b4ec5d8-0000-1111-2222-555555555555/1/0"]\n`)).toEqual([])
    // that name is a MIG device too: not two of them
    expect(problemsOf(`${MODEL}tp = 2\ngpus = ["${A}", "MIG-GPU-4b4ec5d8-0000-1111-2222-555555555555/1/0"]\n`)).toEqual(
      [`models."m".gpus: lists 2 MIG devices, but ${ONE}: give the engine one`]
    )
  })
  it.each([
    ["two MIG devices", `tp = 2\ngpus = ["${A}", "${B}"]\n`, `lists 2 MIG devices, but ${ONE}: give the engine one`],
    [
      "a MIG device beside a whole GPU",
      `tp = 2\ngpus = [0, "${A}"]\n`,
      `lists MIG device ${A} with whole GPUs, but ${ONE} and none beside a whole GPU: give the engine the MIG device alone`
    ],
    [
      "a MIG device for tp x dp = 2",
      `dp = 2\ngpus = ["${A}"]\n`,
      `names MIG device ${A}, one CUDA device, but the engine needs tp x dp = 2 and ${ONE}: set tp and dp to 1`
    ]
  ])("%s is refused with the key and why", (_what, lines, reason) => {
    expect(problemsOf(`${MODEL}${lines}`)).toEqual([`models."m".gpus: ${reason}`])
  })
})
