// Which texts in agent.state_dir/etcd-lease are lease records (layers/registry/leaseRecord.ts decodeLeaseRecord): a
// decimal lease id as etcd gives it, a string (a JSON number past 2^53 would name another lease). Anything else is
// no record: its lease is never revoked as the previous agent's.
import { describe, expect, it } from "vitest"
import { decodeLeaseRecord } from "../../src/layers/registry/leaseRecord.ts"

describe("decodeLeaseRecord", () => {
  it("a decimal lease id as etcd gives it; anything else is no record", () => {
    expect(decodeLeaseRecord('{"lease":"4111120487276619526","epoch":"390e1f2b3c4d5e06"}')).toBe("4111120487276619526")
    for (const text of [
      '{"lease":4111120487276619526}',
      '{"lease":"0"}',
      '{"lease":"0123"}',
      '{"lease":"0x39"}',
      '{"lease":"12a"}',
      '{"lease":"123456789012345678901"}',
      "{",
      ""
    ])
      expect(decodeLeaseRecord(text), text).toBeUndefined()
  })
})
