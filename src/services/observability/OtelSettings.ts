/**
 * Where and as whom the agent exports traces: the standard OpenTelemetry environment
 * (opentelemetry-specification, "SDK environment variables" and "OTLP exporter configuration"), with
 * `[agent].otlp_endpoint` as an override of the endpoint. Pure: the environment is an argument.
 *
 * - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: no export, whatever else is set.
 * - The endpoint: `[agent].otlp_endpoint` + `/v1/traces`, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is,
 *   else OTEL_EXPORTER_OTLP_ENDPOINT + `/v1/traces`; none of them: no export (no span is recorded).
 * - The service name: OTEL_SERVICE_NAME, else `service.name` in OTEL_RESOURCE_ATTRIBUTES, else `cgn-agent`.
 * - The exporter's timeout (OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT) and the batch processor's settings (OTEL_BSP_*):
 *   read here too, so the environment handed in decides them (the SDK would read process.env).
 * Headers, compression and TLS files (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, ...) are read by the OTLP exporter itself.
 */

export type Env = Readonly<Record<string, string | undefined>>

export interface OtlpTraceSettings {
  /** The full OTLP/HTTP traces URL. */
  readonly url: string
  /** The URL as logs and /status show it: a password or user and the query (a token) replaced by `***`. */
  readonly shown: string
  readonly serviceName: string
  /** Settings the agent cannot honour, to log once at start. */
  readonly warnings: ReadonlyArray<string>
  /** Milliseconds per export, retries included; absent: the exporter's default (10 s). */
  readonly timeoutMillis?: number
  /** The BatchSpanProcessor's settings that are set; an absent one keeps the SDK's default. */
  readonly batch: BatchSettings
}

/** The BatchSpanProcessor's options, named as the SDK names them (BufferConfig). */
export interface BatchSettings {
  readonly maxQueueSize?: number
  readonly maxExportBatchSize?: number
  readonly scheduledDelayMillis?: number
  readonly exportTimeoutMillis?: number
}

/** The OTEL_BSP_* variable of each BatchSpanProcessor option (the specification's "Batch Span Processor"). */
const BATCH_ENV: ReadonlyArray<readonly [keyof BatchSettings, string]> = [
  ["maxQueueSize", "OTEL_BSP_MAX_QUEUE_SIZE"],
  ["maxExportBatchSize", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"],
  ["scheduledDelayMillis", "OTEL_BSP_SCHEDULE_DELAY"],
  ["exportTimeoutMillis", "OTEL_BSP_EXPORT_TIMEOUT"]
]

export const DEFAULT_SERVICE_NAME = "cgn-agent"

/** An environment value, or undefined when unset or blank (the spec treats empty as unset). */
const get = (env: Env, name: string): string | undefined => {
  const v = env[name]?.trim()
  return v === undefined || v === "" ? undefined : v
}

/** `/v1/traces` added to the base's path, before its query if it has one. */
const tracesUrl = (base: string): string => {
  try {
    const u = new URL(base)
    u.pathname = `${u.pathname.replace(/\/+$/, "")}/v1/traces`
    return u.toString()
  } catch {
    return `${base.replace(/\/+$/, "")}/v1/traces`
  }
}

/** `url` without what may be a secret: its user and password, and its query's values. */
export const shownUrl = (url: string): string => {
  try {
    const u = new URL(url)
    if (u.username !== "" || u.password !== "") {
      u.username = "***"
      u.password = ""
    }
    for (const key of [...u.searchParams.keys()]) u.searchParams.set(key, "***")
    return u.toString()
  } catch {
    return "(not a URL)"
  }
}

/**
 * A millisecond or count setting: a number > 0, else undefined, and then the SDK reads the variable itself and
 * handles a malformed one as it would without the agent (the OTLP exporter throws on a timeout <= 0 passed to it).
 */
const getNumber = (env: Env, name: string): number | undefined => {
  const v = get(env, name)
  const n = v === undefined ? Number.NaN : Number(v)
  return Number.isFinite(n) && n > 0 ? n : undefined
}

/** `service.name` from an OTEL_RESOURCE_ATTRIBUTES list (`k=v,k=v`, percent-encoded values). */
const serviceNameFromResource = (attributes: string | undefined): string | undefined => {
  for (const pair of attributes?.split(",") ?? []) {
    const eq = pair.indexOf("=")
    if (eq <= 0 || pair.slice(0, eq).trim() !== "service.name") continue
    try {
      const value = decodeURIComponent(pair.slice(eq + 1).trim())
      if (value !== "") return value
    } catch {
      // a malformed escape: ignore the entry, as the SDKs do
    }
  }
  return undefined
}

/** The export settings, or undefined when traces are not exported. */
export const otlpTraceSettings = (configEndpoint: string | undefined, env: Env): OtlpTraceSettings | undefined => {
  if (get(env, "OTEL_SDK_DISABLED")?.toLowerCase() === "true") return undefined
  const exporters = (get(env, "OTEL_TRACES_EXPORTER") ?? "otlp").split(",").map((e) => e.trim().toLowerCase())
  if (exporters.includes("none")) return undefined
  const fromEnv = get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
  const base = get(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
  const url =
    configEndpoint !== undefined && configEndpoint.trim() !== ""
      ? tracesUrl(configEndpoint.trim())
      : (fromEnv ?? (base === undefined ? undefined : tracesUrl(base)))
  if (url === undefined) return undefined

  const warnings: Array<string> = []
  const unsupported = exporters.filter((e) => e !== "otlp")
  if (unsupported.length > 0) warnings.push(`OTEL_TRACES_EXPORTER=${unsupported.join(",")}: only otlp is supported`)
  const protocol = get(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") ?? get(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
  if (protocol !== undefined && protocol !== "http/json" && protocol !== "http/protobuf")
    warnings.push(
      `OTEL_EXPORTER_OTLP_PROTOCOL=${protocol} is not supported; exporting OTLP/HTTP (JSON) to ${shownUrl(url)}`
    )
  const serviceName =
    get(env, "OTEL_SERVICE_NAME") ??
    serviceNameFromResource(get(env, "OTEL_RESOURCE_ATTRIBUTES")) ??
    DEFAULT_SERVICE_NAME
  const timeoutMillis =
    getNumber(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") ?? getNumber(env, "OTEL_EXPORTER_OTLP_TIMEOUT")
  const batch: Record<string, number> = {}
  for (const [option, name] of BATCH_ENV) {
    const n = getNumber(env, name)
    if (n !== undefined) batch[option] = n
  }
  return {
    url,
    shown: shownUrl(url),
    serviceName,
    warnings,
    ...(timeoutMillis === undefined ? {} : { timeoutMillis }),
    batch
  }
}
