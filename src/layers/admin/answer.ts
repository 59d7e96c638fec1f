/**
 * The admin routes' JSON answers: `json` (the one helper every route answers JSON with) and `refuse`, a refusal or
 * failure as `{"error": ...}` with the status the one table gives its tag (services/admin/AdminAnswers.ts).
 */
import { HttpServerResponse } from "effect/http"
import { type AdminErrorTag, adminStatus } from "../../services/admin/AdminAnswers.ts"

export const json = (body: unknown, status = 200) => HttpServerResponse.jsonUnsafe(body, { status })

export const refuse = (tag: AdminErrorTag, error: string) => json({ error }, adminStatus[tag])
