/**
 * AdminAnswers: the admin server's one table of refusals and failures, from each one's tag to the HTTP status it is
 * answered with (`adminStatus`). Every admin route and gate (layers/admin) takes its error status from here, and
 * `restartAnswer` (EngineRestart.ts) its refusals'; the table is a mapped type over `AdminErrorTag`, so a tag without
 * a row fails the type check, and a route that answers an error class by `adminStatus[e._tag]` fails it too when the
 * class's tag has no row. Successes (200, 202, 204) stay with the route that answers them.
 */

/**
 * Every way an admin request is refused or fails. The error classes' own tags where one exists (services/node/Cordon.ts,
 * services/node/Nvml.ts, layers/admin/body.ts, layers/admin/cpuProfile.ts); the rest name a refusal with no class.
 */
export type AdminErrorTag =
  // the gates, before any route runs: layers/admin/hostCheck.ts, methods.ts, authGate.ts
  | "MisdirectedHost"
  | "WrongMethod"
  | "TokenMissing"
  | "TokenWrong"
  | "FromWebPage"
  // the request itself: layers/admin/body.ts, a lever's query or body
  | "BodyTooLarge"
  | "BodyReadFailed"
  | "InvalidQuery"
  | "CordonReasonInvalid"
  // the lever cannot act now, or on that
  | "NodeDraining"
  | "EngineNotReady"
  | "EngineNotSpawned"
  | "ProfileBusy"
  | "UnknownGpu"
  | "GpuNotIdentified"
  // the agent failed: nothing was done
  | "CordonPersistError"
  | "XidRecordError"
  | "InspectorError"

export const adminStatus: { readonly [T in AdminErrorTag]: number } = {
  // 421, not 403: refused for where it was addressed, not for who sent it (hostCheck.ts)
  MisdirectedHost: 421,
  WrongMethod: 405,
  TokenMissing: 401,
  TokenWrong: 401,
  FromWebPage: 403,
  BodyTooLarge: 413,
  BodyReadFailed: 400,
  InvalidQuery: 400,
  CordonReasonInvalid: 400,
  // a drain is final: an uncordon or an engine restart under it is a conflict with the node's state
  NodeDraining: 409,
  EngineNotReady: 409,
  EngineNotSpawned: 409,
  ProfileBusy: 409,
  UnknownGpu: 404,
  // the GPU is there but cannot be named now: the same request may succeed later, or by UUID
  GpuNotIdentified: 409,
  CordonPersistError: 500,
  XidRecordError: 500,
  InspectorError: 500
}
