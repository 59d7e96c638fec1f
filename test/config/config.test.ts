// Config decoding: bad files with their exact messages (one line per problem, naming the key path), the
// defaults of a minimal file, node_id resolution, and reading a file from disk (UTF-8 only).
import { execFile } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Duration, Effect, Exit, Option, Result } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeConfig, decodeConfigBytes, loadConfigFile } from "../../src/layers/config/Config.ts"
import { configPath } from "../../src/programs/configOption.ts"
import { knownKeys } from "../../src/services/config/ConfigSchema.ts"
import { prng } from "../../src/sim/tokens.ts"
import { agentEntry, requireDist } from "../support/agent.ts"

const MODEL = '[models.m]\nhf_repo = "a/b"\n'

const problemsOf = (text: string, env: Record<string, string> = {}): ReadonlyArray<string> => {
  const r = decodeConfig(text, "bad.toml", env)
  return Result.isFailure(r) ? r.failure.problems : []
}

/** [what is wrong, the file, every line of the error]. */
const bad: ReadonlyArray<[string, string, ReadonlyArray<string>]> = [
  [
    "TOML syntax: unterminated string",
    '[agent]\nlisten_grpc = "0.0.0.0:7071\n',
    [
      "agent.listen_grpc: line 2, column 28: Invalid TOML document: control characters are not allowed in strings (a string not closed on its line?)"
    ]
  ],
  [
    "TOML syntax: unterminated string, CRLF line ends",
    '[agent]\r\nnode_id = "oncall-1\r\nmax_inflight = 2\r\n',
    [
      "agent.node_id: line 2, column 20: Invalid TOML document: control characters are not allowed in strings (a string not closed on its line?)"
    ]
  ],
  [
    "TOML syntax: a control character inside a closed string is not an unclosed one",
    '[agent]\nnode_id = "a\u0001b"\n',
    ["agent.node_id: line 2, column 13: Invalid TOML document: control characters are not allowed in strings"]
  ],
  [
    "TOML syntax: doubled =",
    `${MODEL}tp = = 2\n`,
    ['models."m".tp: line 3, column 6: Invalid TOML document: invalid value']
  ],
  [
    "wrong type: string for an integer",
    `[agent]\nmax_inflight = "many"\n${MODEL}`,
    ['agent.max_inflight: expected an integer, got "many"']
  ],
  [
    "a number in quotes: said so, with the number as the example (an integer, a number)",
    `[agent]\nmax_inflight = "256"\n${MODEL}gpu_memory_utilization = "0.9"\ntp = "0"\n`,
    [
      'agent.max_inflight: expected an integer such as 256 (a TOML number, without quotes), got "256"',
      'models."m".tp: expected an integer (a TOML number, without quotes), got "0"',
      'models."m".gpu_memory_utilization: expected a number such as 0.9 (a TOML number, without quotes), got "0.9"'
    ]
  ],
  [
    "a model name with dots, unquoted: TOML splits it; the hint says to quote it",
    '[models.qwen2.5-0.5b]\nhf_repo = "Qwen/Qwen2.5-0.5B-Instruct"\n',
    ['models."qwen2".5-0: unknown key; a model name with dots must be quoted: [models."qwen2.5-0.5b"]']
  ],
  [
    "wrong types: string for a boolean, float for an integer",
    `[security]\nrequire_mtls = "yes"\n${MODEL}tp = 1.5\n`,
    ['security.require_mtls: expected true or false, got "yes"', 'models."m".tp: expected an integer, got 1.5']
  ],
  ["wrong type inside a table", `[engine]\nenv = { A = 1 }\n${MODEL}`, ["engine.env.A: expected a string, got 1"]],
  [
    "an empty string where one is needed; a value of neither type a list takes",
    `[agent]\nnode_id = ""\n${MODEL}gpus = [true]\n`,
    ['agent.node_id: expected a non-empty value, got ""', 'models."m".gpus[0]: expected a number or a string, got true']
  ],
  [
    "a secret written as a number: its value is not echoed (README Secrets: the key's name says so)",
    `[agent]\nadmin_token = 31415926535\n[engine]\nenv = { HF_TOKEN = 987654321 }\n${MODEL}`,
    [
      "agent.admin_token: expected a string, got a number (not shown: a secret's key)",
      "engine.env.HF_TOKEN: expected a string, got a number (not shown: a secret's key)"
    ]
  ],
  [
    "unknown key with a suggestion",
    `[agent]\nlisten_grcp = "0.0.0.0:7071"\n${MODEL}`,
    ['agent.listen_grcp: unknown key; did you mean "listen_grpc"?']
  ],
  [
    "unknown section with a suggestion",
    `[engin]\nkind = "vllm"\n${MODEL}`,
    ['engin: unknown key; did you mean "engine"?']
  ],
  [
    "unknown model key, nothing close: the valid keys",
    `${MODEL}tensor_parallel = 2\n`,
    [
      'models."m".tensor_parallel: unknown key; valid keys: hf_repo, path, tp, dp, served_name, max_model_len, gpu_memory_utilization, args, gpus'
    ]
  ],
  [
    "bad duration",
    `[agent]\nheartbeat = "5 sec"\n${MODEL}`,
    ['agent.heartbeat: expected a duration such as "500ms", "5s", "2m" or "1h", got "5 sec"']
  ],
  [
    "duration as a number",
    `[engine]\nstop_grace = 30\n${MODEL}`,
    [
      'engine.stop_grace: expected a duration such as "500ms", "5s", "2m" or "1h" (a quoted string with a unit), got 30: write "30s"'
    ]
  ],
  [
    "bad host:port: no host",
    `[agent]\nlisten_grpc = "7071"\n${MODEL}`,
    ['agent.listen_grpc: expected host:port such as "0.0.0.0:7071", got "7071"']
  ],
  [
    "bad host:port: port out of range",
    `[agent]\nlisten_admin = "127.0.0.1:99999"\n${MODEL}`,
    ['agent.listen_admin: expected host:port such as "0.0.0.0:7071", got "127.0.0.1:99999": the port is at most 65535']
  ],
  [
    "bad host:port: an IPv4 address in brackets, four numbers that are no IPv4 address",
    `[agent]\nlisten_grpc = "[10.0.0.7]:7071"\nlisten_admin = "999.0.0.1:9091"\n${MODEL}`,
    [
      'agent.listen_grpc: expected host:port such as "0.0.0.0:7071", got "[10.0.0.7]:7071": [10.0.0.7] is not an IPv6 address (brackets are for IPv6 only)',
      'agent.listen_admin: expected host:port such as "0.0.0.0:7071", got "999.0.0.1:9091": 999.0.0.1 is not an IPv4 address'
    ]
  ],
  [
    "durations of 0 where 0 makes no sense (a timer that fires at once, every time), and one under its floor",
    `[agent]\nhandoff_timeout = "0s"\nkeepalive_time = "500ms"\nkeepalive_timeout = "0s"\n[engine]\nstartup_timeout = "0ms"\nrestart_backoff_initial = "0s"\nrestart_backoff_max = "0m"\nliveness_interval = "0s"\nstream_idle_timeout = "0h"\n${MODEL}`,
    [
      'agent.keepalive_time: expected "0s" or a duration of at least 1s, got "500ms": every idle connection would be pinged as often (grpc-go\'s server takes 1s at the least)',
      'agent.keepalive_timeout: expected a duration above 0 such as "5s", got "0s": a connection pinged would be closed at once, before its client could answer',
      'agent.handoff_timeout: expected a duration above 0 such as "5s", got "0s": every prefill and decode leg would time out at once',
      'engine.startup_timeout: expected a duration above 0 such as "5s", got "0ms": every engine start would time out before the engine could be ready',
      'engine.restart_backoff_initial: expected a duration above 0 such as "5s", got "0s": a crashing engine would be restarted at once, over and over (the backoff doubles 0)',
      'engine.restart_backoff_max: expected a duration above 0 such as "5s", got "0m": a crashing engine would be restarted at once, over and over (no delay is longer than 0)',
      'engine.liveness_interval: expected a duration above 0 such as "5s", got "0s": a ready engine would be probed without pause, each probe given no time to answer',
      'engine.stream_idle_timeout: expected a duration above 0 such as "5s", got "0h": every engine stream would be ended at its first pause between two chunks'
    ]
  ],
  [
    "KVBM cache-tier sizes of inf",
    `[engine]\nkv_offload = "kvbm"\nkvbm_cpu_cache_gb = inf\n${MODEL}`,
    ["engine.kvbm_cpu_cache_gb: expected a finite number, got Infinity"]
  ],
  [
    "KV event endpoints that are no ZMQ endpoint",
    `[kv]\nevents = true\nevents_endpoint = "127.0.0.1:5557"\nreplay_endpoint = "tcp://127.0.0.1:70000"\n${MODEL}`,
    [
      'kv.events_endpoint: expected a ZMQ endpoint such as "tcp://127.0.0.1:5557", "tcp://*:5557" or "ipc:///run/kv.sock", got "127.0.0.1:5557"',
      'kv.replay_endpoint: expected a ZMQ endpoint such as "tcp://127.0.0.1:5557", "tcp://*:5557" or "ipc:///run/kv.sock", got "tcp://127.0.0.1:70000": the port is at most 65535'
    ]
  ],
  [
    "a model table with an empty name (the served name would be empty)",
    '[models.""]\nhf_repo = "a/b"\n',
    [
      'models."": the table\'s name is the model\'s name (and served_name\'s default); give it one, such as [models."llama-3-8b"]'
    ]
  ],
  [
    "unknown engine kind",
    `[engine]\nkind = "tgi"\n${MODEL}`,
    ['engine.kind: expected one of "vllm", "sglang", "llama_cpp", "mlx", "openai_compat", got "tgi"']
  ],
  [
    "unknown role",
    `[agent]\nrole = "prefil"\n${MODEL}`,
    ['agent.role: expected one of "prefill", "decode", "both", got "prefil"']
  ],
  [
    "unknown kv_offload",
    `[engine]\nkv_offload = "mooncake"\n${MODEL}`,
    ['engine.kv_offload: expected one of "none", "nixl", "lmcache", "hicache", "kvbm", got "mooncake"']
  ],
  [
    "missing cert paths under require_mtls",
    `[security]\nrequire_mtls = true\nca_file = "/ca"\n${MODEL}`,
    [
      "security.cert_file: required when security.require_mtls = true",
      "security.key_file: required when security.require_mtls = true"
    ]
  ],
  [
    "two models",
    '[models.a]\nhf_repo = "a/b"\n[models.b]\npath = "/m"\n',
    ['models: 2 models configured ("a", "b"); this version serves exactly one [models."name"] table per agent']
  ],
  [
    "no model",
    '[engine]\nkind = "vllm"\n',
    ['models: no model configured; add one table such as [models."llama-3-8b"] with hf_repo or path']
  ],
  ["model without a source", "[models.m]\ntp = 2\n", ['models."m": set hf_repo or path']],
  ["model with two sources", `${MODEL}path = "/m"\n`, ['models."m": set hf_repo or path, not both']],
  [
    "engine url without a scheme",
    `[engine]\nurl = "127.0.0.1:8000"\n${MODEL}`,
    ['engine.url: expected an http:// or https:// URL, got "127.0.0.1:8000"']
  ],
  [
    "etcd endpoint without http",
    `[cluster]\netcd = ["etcd:2379"]\n${MODEL}`,
    ['cluster.etcd[0]: expected an http:// or https:// URL, got "etcd:2379"']
  ],
  [
    "lease not longer than the heartbeat",
    `[agent]\nheartbeat = "5s"\nlease_ttl = "5s"\n${MODEL}`,
    ["agent.lease_ttl: must be longer than agent.heartbeat, or the lease expires between two heartbeats"]
  ],
  [
    "number out of range",
    `${MODEL}gpu_memory_utilization = 1.5\n`,
    ['models."m".gpu_memory_utilization: expected at most 1, got 1.5']
  ],
  ["empty command", `[engine]\ncommand = []\n${MODEL}`, ["engine.command: expected a non-empty list"]],
  [
    "a KV queue bound of zero bytes",
    `[kv]\nmax_queue_bytes = 0\n${MODEL}`,
    ["kv.max_queue_bytes: expected at least 1, got 0"]
  ],
  ["a section that is not a table", `agent = 3\n${MODEL}`, ["agent: expected a table, got 3"]],
  [
    "every problem of a file at once",
    `[agent]\nheartbeat = "fast"\nrole = "x"\nlisten_grpc = "nope"\n${MODEL}tp = 0\n`,
    [
      'agent.listen_grpc: expected host:port such as "0.0.0.0:7071", got "nope"',
      'agent.heartbeat: expected a duration such as "500ms", "5s", "2m" or "1h", got "fast"',
      'agent.role: expected one of "prefill", "decode", "both", got "x"',
      'models."m".tp: expected at least 1, got 0'
    ]
  ],
  [
    "engine combination: vLLM prefill without NIXL",
    `[agent]\nrole = "prefill"\n${MODEL}`,
    [
      'engine.kv_offload: vllm with agent.role = "prefill" needs kv_offload "nixl", got "none" (the NIXL connector hands the prefilled KV cache to the decode instance)'
    ]
  ],
  [
    "engine combination: llama.cpp with an offload, a role and tp",
    `[engine]\nkind = "llama_cpp"\nkv_offload = "lmcache"\n[agent]\nrole = "decode"\n${MODEL}tp = 2\n`,
    [
      'engine.kv_offload: llama_cpp does not support "lmcache"; llama_cpp supports "none"',
      'agent.role: llama_cpp cannot run role "decode" (no prefill/decode disaggregation); llama_cpp supports "both"',
      'models."m".tp: llama_cpp has no tensor parallelism; set tp = 1'
    ]
  ],
  [
    "engine.url with a path (a common mistake: the /v1 suffix)",
    `[engine]\nkind = "openai_compat"\nurl = "http://10.0.0.5:8000/v1"\n${MODEL}`,
    [
      'engine.url: give the engine\'s server root (scheme, host, port), not a path: the agent adds /v1/... itself; got "http://10.0.0.5:8000/v1"'
    ]
  ],
  [
    "engine.url https for a spawned engine",
    `[engine]\nurl = "https://127.0.0.1:8000"\n${MODEL}`,
    ["engine.url: vllm is spawned by the agent and serves plain HTTP on its host:port; use http://"]
  ],
  [
    "KVBM cache-tier sizes without kv_offload kvbm",
    `[engine]\nkv_offload = "lmcache"\nkvbm_cpu_cache_gb = 4\nkvbm_disk_cache_gb = 0\n${MODEL}`,
    ["engine.kvbm_disk_cache_gb: expected more than 0, got 0"]
  ],
  [
    "KVBM cache-tier size with another offload",
    `[engine]\nkv_offload = "lmcache"\nkvbm_cpu_cache_gb = 4\n${MODEL}`,
    ['engine.kvbm_cpu_cache_gb: sizes a KVBM cache tier, used only with engine.kv_offload = "kvbm"; remove it']
  ],
  [
    "engine.liveness_path not a path",
    `[engine]\nliveness_path = "health_generate"\n${MODEL}`,
    ['engine.liveness_path: expected a path on the engine such as "/health_generate", got "health_generate"']
  ],
  [
    "GPUs set by hand in engine.env (the agent would watch others)",
    `[engine]\nenv = { CUDA_VISIBLE_DEVICES = "2,3" }\n${MODEL}tp = 2\n`,
    [
      'engine.env.CUDA_VISIBLE_DEVICES: the agent gives the engine its GPUs and watches those; list them as models."m".gpus (NVML indices or UUIDs) instead'
    ]
  ],
  [
    // POSIX: an entry is NAME=value; spawned, "CUDA_VISIBLE_DEVICES=7" = "x" reached Python as CUDA_VISIBLE_DEVICES "7=x"
    'engine.env names with "=" or empty (past the refusal above)',
    `[engine]\nenv = { "CUDA_VISIBLE_DEVICES=7" = "x", "" = "y", OK = "z" }\n${MODEL}`,
    [
      'engine.env."CUDA_VISIBLE_DEVICES=7": a name with "=" in it is no environment variable (an entry is NAME=value, the name ending at the first "="); write the variable\'s name alone',
      'engine.env."": an empty name is no environment variable (an entry is NAME=value, the name ending at the first "="); write the variable\'s name alone'
    ]
  ],
  [
    "gpus: not tp x dp of them, one twice",
    `${MODEL}tp = 2\ngpus = [1, 1, 2]\n`,
    ['models."m".gpus: lists 3 GPUs but the engine needs tp x dp = 2', 'models."m".gpus: GPU 1 is listed twice']
  ],
  [
    "gpus on an engine that does not run on assigned GPUs",
    `[engine]\nkind = "mlx"\n[models.m]\npath = "/m"\ngpus = [0]\n`,
    ['models."m".gpus: mlx does not run on GPUs the agent assigns; remove gpus']
  ],
  [
    "engine combination: vLLM has no hicache",
    `[engine]\nkv_offload = "hicache"\n${MODEL}`,
    ['engine.kv_offload: vllm does not support "hicache"; vllm supports "none", "nixl", "lmcache", "kvbm"']
  ],
  [
    "two listeners on one port, one of them a wildcard (the default listen_grpc is 0.0.0.0:7071)",
    `[agent]\nlisten_admin = "127.0.0.1:7071"\n${MODEL}`,
    [
      'agent.listen_admin: "127.0.0.1:7071" overlaps agent.listen_grpc = "0.0.0.0:7071" (same port, and 0.0.0.0 is every address of this host); the second to bind would fail with EADDRINUSE: give each its own port'
    ]
  ],
  [
    "three listeners on one host:port (IPv6 written two ways; [::] is a wildcard too)",
    `[agent]\nlisten_grpc = "[::1]:7071"\nlisten_admin = "[0:0::1]:7071"\nlisten_health = "[::]:7071"\n${MODEL}`,
    [
      'agent.listen_admin: "[0:0::1]:7071" overlaps agent.listen_grpc = "[::1]:7071" (same host and port); the second to bind would fail with EADDRINUSE: give each its own port',
      'agent.listen_health: "[::]:7071" overlaps agent.listen_grpc = "[::1]:7071" (same port, and [::] is every address of this host); the second to bind would fail with EADDRINUSE: give each its own port',
      'agent.listen_health: "[::]:7071" overlaps agent.listen_admin = "[0:0::1]:7071" (same port, and [::] is every address of this host); the second to bind would fail with EADDRINUSE: give each its own port'
    ]
  ],
  [
    "localhost meets ::1 as well as 127.0.0.1 on one port (the resolver decides which it binds)",
    `[agent]\nlisten_grpc = "localhost:7071"\nlisten_admin = "[::1]:7071"\nlisten_health = "127.0.0.1:7071"\n${MODEL}`,
    [
      'agent.listen_admin: "[::1]:7071" overlaps agent.listen_grpc = "localhost:7071" (same port, and [::1] and localhost both name [::1]); the second to bind would fail with EADDRINUSE: give each its own port',
      'agent.listen_health: "127.0.0.1:7071" overlaps agent.listen_grpc = "localhost:7071" (same port, and 127.0.0.1 and localhost both name 127.0.0.1); the second to bind would fail with EADDRINUSE: give each its own port'
    ]
  ],
  [
    "a spawned engine on the agent's gRPC port",
    `[agent]\nlisten_grpc = "0.0.0.0:8000"\n${MODEL}`,
    [
      'engine.url: vllm is spawned by the agent on port 8000, which overlaps agent.listen_grpc = "0.0.0.0:8000" (same port, and 0.0.0.0 is every address of this host); the engine would fail with EADDRINUSE and be restarted again and again: give it another port'
    ]
  ],
  [
    "a spawned engine on the admin port, through the scheme's port (http: 80)",
    `[agent]\nlisten_admin = "127.0.0.1:80"\n[engine]\nkind = "llama_cpp"\nurl = "http://127.0.0.1"\n${MODEL}`,
    [
      'engine.url: llama_cpp is spawned by the agent on port 80, which overlaps agent.listen_admin = "127.0.0.1:80" (same host and port); the engine would fail with EADDRINUSE and be restarted again and again: give it another port'
    ]
  ],
  [
    "a spawned engine on port 0",
    `[engine]\nkind = "sglang"\nurl = "http://127.0.0.1:0"\n${MODEL}`,
    [
      'engine.url: sglang is spawned by the agent on this port and probed there; port 0 would start it with --port 0 and probe port 0 until engine.startup_timeout, got "http://127.0.0.1:0"; give a fixed port such as 8000'
    ]
  ],
  [
    "a proxied server on port 0",
    `[engine]\nkind = "openai_compat"\nurl = "http://10.0.0.5:0"\n${MODEL}`,
    [
      'engine.url: openai_compat proxies a server someone else runs, and port 0 is no port it can listen on: the agent would probe port 0 for ever, got "http://10.0.0.5:0"; give the server\'s port'
    ]
  ],
  [
    "credentials in engine.url (never echoed)",
    `[engine]\nurl = "http://admin:s3cret@127.0.0.1:8000"\n${MODEL}`,
    [
      "engine.url: credentials do not belong in the URL; an engine that asks for an API key gets it from engine.api_key, which the agent sends as a bearer token (and hands to an engine it spawns)"
    ]
  ],
  [
    "credentials in an etcd endpoint (never echoed)",
    `[cluster]\netcd = ["https://etcd-0:2379", "https://root:s3cret@etcd-1:2379"]\n${MODEL}`,
    [
      "cluster.etcd[1]: credentials do not belong in the URL; set cluster.etcd_username and cluster.etcd_password instead"
    ]
  ],
  [
    "a URL that is not http, with a password: the password is not echoed",
    `[cluster]\netcd = ["ftp://root:s3cret@etcd:2379"]\n${MODEL}`,
    [
      'cluster.etcd[0]: expected an http:// or https:// URL, got "ftp://root:<redacted>@etcd:2379"',
      "cluster.etcd[0]: credentials do not belong in the URL; set cluster.etcd_username and cluster.etcd_password instead"
    ]
  ],
  [
    "a URL that does not parse, with a token for userinfo or an @ in its password: neither is echoed",
    `[cluster]\netcd = ["https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@etcd:99999", "http://u:p@ss@etcd:70000"]\n${MODEL}`,
    [
      'cluster.etcd[0]: expected an http:// or https:// URL, got "https://<redacted>@etcd:99999": port 99999 is past 65535',
      'cluster.etcd[1]: expected an http:// or https:// URL, got "http://u:<redacted>@etcd:70000": port 70000 is past 65535'
    ]
  ],
  [
    "a first restart delay set above the cap that overrules it",
    `[engine]\nrestart_backoff_initial = "10s"\nrestart_backoff_max = "2s"\n${MODEL}`,
    [
      "engine.restart_backoff_initial: 10s is longer than engine.restart_backoff_max (2s), which caps every delay, the first one too; set it to at most 2s, or raise restart_backoff_max"
    ]
  ],
  [
    "etcd key parts: node_id and cluster.name with a / or a control character",
    `[cluster]\nname = "prod/nodes/x"\n[agent]\nnode_id = "gpu-7\\n"\n${MODEL}`,
    [
      'cluster.name: expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got "prod/nodes/x"',
      'agent.node_id: expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got "gpu-7\\n"'
    ]
  ],
  [
    "etcd_prefix not starting with /",
    `[cluster]\netcd_prefix = "cgn"\n${MODEL}`,
    ['cluster.etcd_prefix: expected a key prefix starting with "/", such as "/cgn", got "cgn"']
  ],
  [
    "etcd_prefix / alone",
    `[cluster]\netcd_prefix = "/"\n${MODEL}`,
    [
      'cluster.etcd_prefix: expected a key prefix such as "/cgn", got "/": it would put the node keys at the root of etcd (/<name>/nodes/...), among other applications\' keys'
    ]
  ],
  [
    "etcd_prefix ending with /",
    `[cluster]\netcd_prefix = "/cgn/"\n${MODEL}`,
    [
      'cluster.etcd_prefix: expected no "/" at the end (keys are <etcd_prefix>/<name>/nodes/<node_id>), got "/cgn/"; write "/cgn"'
    ]
  ],
  [
    "etcd_prefix with an empty part",
    `[cluster]\netcd_prefix = "/cgn//prod"\n${MODEL}`,
    ['cluster.etcd_prefix: expected no empty part ("//"), got "/cgn//prod"']
  ],
  [
    "advertise_addr a wildcard",
    `[agent]\nadvertise_addr = "[::]:7071"\n${MODEL}`,
    [
      'agent.advertise_addr: expected an address the router can dial, got "[::]:7071": [::] is every address of this host, not one; give this host\'s IP or DNS name'
    ]
  ],
  [
    "advertise_addr on port 0",
    `[agent]\nadvertise_addr = "10.0.0.7:0"\n${MODEL}`,
    [
      'agent.advertise_addr: expected an address the router can dial, got "10.0.0.7:0": port 0 is no port to dial; give listen_grpc\'s port, or leave advertise_addr unset to publish the port listen_grpc binds'
    ]
  ],
  [
    "Xids outside 1..999, not integers, not a list",
    `[engine]\nignore_xids = [0, 92]\nfault_xids = [1000, 1.5, "13"]\n${MODEL}`,
    [
      "engine.ignore_xids[0]: expected an Xid from 1 to 999 (NVIDIA's Xid catalog numbers them), got 0",
      "engine.fault_xids[0]: expected an Xid from 1 to 999 (NVIDIA's Xid catalog numbers them), got 1000",
      "engine.fault_xids[1]: expected an integer, got 1.5",
      'engine.fault_xids[2]: expected an integer such as 13 (a TOML number, without quotes), got "13"'
    ]
  ],
  ["Xids not a list", `[engine]\nignore_xids = 92\n${MODEL}`, ["engine.ignore_xids: expected an array, got 92"]],
  [
    "an Xid both ignored and a fault",
    `[engine]\nignore_xids = [92, 13, 92]\nfault_xids = [13, 48, 92]\n${MODEL}`,
    [
      "engine.fault_xids: 13, 92 also listed in engine.ignore_xids; an Xid is either a fault or ignored: keep each in one list"
    ]
  ],
  // README agent.heartbeat: "At least `100ms`"
  ["agent.heartbeat under 100ms", `[agent]\nheartbeat = "99ms"\n${MODEL}`, ["agent.heartbeat: must be at least 100ms"]],
  // README cluster.etcd_username / etcd_password: set together
  [
    "an etcd user without a password",
    `[cluster]\netcd = ["http://127.0.0.1:2379"]\netcd_username = "cgn"\n${MODEL}`,
    ["cluster.etcd_username: etcd_username and etcd_password go together; set both or neither"]
  ],
  [
    "an etcd password without a user",
    `[cluster]\netcd = ["http://127.0.0.1:2379"]\netcd_password = "pw"\n${MODEL}`,
    ["cluster.etcd_username: etcd_username and etcd_password go together; set both or neither"]
  ],
  // README models.<name>.gpus: "exactly tp × dp entries": too few as well as too many
  [
    "gpus: fewer than tp x dp",
    `${MODEL}tp = 2\ngpus = [0]\n`,
    ['models."m".gpus: lists 1 GPU but the engine needs tp x dp = 2']
  ],
  // README models.<name>.dp: "(so no `ipc://` endpoint ...)": each rank publishes on the endpoint's port + rank
  [
    "dp > 1 with KV events on an ipc:// endpoint",
    `[kv]\nevents = true\nevents_endpoint = "ipc:///tmp/kv.sock"\n${MODEL}dp = 2\n`,
    [
      'models."m".dp: with dp > 1 every rank publishes KV events on kv.events_endpoint\'s TCP port + rank; an ipc:// endpoint cannot be offset, use tcp://'
    ]
  ],
  // README engine.url: "no path": a query is one too (the agent appends /v1/... to the URL)
  [
    "engine.url with a query",
    `[engine]\nkind = "openai_compat"\nurl = "http://127.0.0.1:8000/?x=1"\n${MODEL}`,
    [
      'engine.url: give the engine\'s server root (scheme, host, port), not a path: the agent adds /v1/... itself; got "http://127.0.0.1:8000/?x=1"'
    ]
  ],
  [
    "a port one past the last",
    `[agent]\nlisten_admin = "127.0.0.1:65536"\n${MODEL}`,
    ['agent.listen_admin: expected host:port such as "0.0.0.0:7071", got "127.0.0.1:65536": the port is at most 65535']
  ],
  [
    "a control character in etcd_prefix",
    `[cluster]\netcd = ["http://127.0.0.1:2379"]\netcd_prefix = "/cgn\\u0007x"\n${MODEL}`,
    ['cluster.etcd_prefix: expected no control characters, got "/cgn\\u0007x"']
  ],
  [
    "KV events' ports overlapping replay's from above (replay one below events, dp 2)",
    `[kv]\nevents = true\nevents_endpoint = "tcp://127.0.0.1:5557"\nreplay_endpoint = "tcp://127.0.0.1:5556"\n${MODEL}dp = 2\n`,
    [
      'kv.replay_endpoint: with models."m".dp = 2 the KV events use ports 5557-5558 and replay ports 5556-5557; they overlap, move replay_endpoint to port 5559 or above'
    ]
  ]
]

describe("bad config files", () => {
  it("there are at least 15", () => {
    expect(bad.length).toBeGreaterThanOrEqual(15)
  })
  it.each(bad)("%s", (_what, text, lines) => {
    expect(problemsOf(text)).toEqual(lines)
  })
  it("no problem line repeats a password written in a URL", () => {
    for (const [, text] of bad) for (const p of problemsOf(text)) expect(p).not.toContain("s3cret")
  })
  it("what the new address and key rules still accept", () => {
    const ok = [
      // port 0: the OS picks a free port for each listener
      `[agent]\nlisten_grpc = "0.0.0.0:0"\nlisten_admin = "127.0.0.1:0"\nlisten_health = "[::]:0"\n${MODEL}`,
      // one port on two specific hosts
      `[agent]\nlisten_grpc = "10.0.0.7:7071"\nlisten_admin = "127.0.0.1:7071"\n${MODEL}`,
      // openai_compat spawns nothing: its server may use any port, even the agent's on another host
      `[agent]\nlisten_grpc = "0.0.0.0:8000"\n[engine]\nkind = "openai_compat"\nurl = "http://10.0.3.7:8000"\n${MODEL}`,
      // a spawned engine on the gRPC port number of another host
      `[agent]\nlisten_grpc = "10.0.0.7:8000"\n${MODEL}`,
      `[cluster]\nname = "prod us-east.1"\netcd_prefix = "/cgn/v1"\n[agent]\nnode_id = "gpu-7.example.com"\nadvertise_addr = "[fd00::7]:7071"\n${MODEL}`,
      // an IPv4-mapped IPv6 address in brackets; 0 where it means "at once" (drain, SIGKILL, every run stable)
      `[agent]\nlisten_grpc = "[::ffff:10.0.0.7]:7071"\ndrain_timeout = "0s"\n[engine]\nstop_grace = "0s"\nrestart_stable_after = "0s"\ngpu_free_timeout = "0s"\n${MODEL}`,
      // a cap below the first delay's default: every restart waits the cap (engine-process.test.ts relies on it)
      `[engine]\nrestart_backoff_max = "300ms"\n${MODEL}`,
      // the first delay set equal to the cap
      `[engine]\nrestart_backoff_initial = "2s"\nrestart_backoff_max = "2s"\n${MODEL}`,
      // the ZMQ endpoints engines bind or connect
      `[kv]\nevents = true\nevents_endpoint = "tcp://*:5557"\nreplay_endpoint = "tcp://[::]:5600"\n${MODEL}`,
      `[kv]\nevents = true\nevents_endpoint = "ipc:///run/cgn/kv.sock"\nreplay_endpoint = "inproc://replay"\n${MODEL}`
    ]
    for (const text of ok) expect(problemsOf(text)).toEqual([])
  })
  it("NODE_IP must be an address a router can dial: an IP (IPv6 with or without brackets) or a DNS name", () => {
    for (const ok of ["10.0.0.7", "fd00::7", "[fd00::7]", "gpu-7.internal", " 10.0.0.7 ", ""])
      expect(problemsOf(MODEL, { NODE_IP: ok }), ok).toEqual([])
    for (const bad of ["0.0.0.0", "::", "10.0.0.7:7071", "999.0.0.1", "$(NODE_IP)", "10.0.0.7 10.0.0.8", "http://x"])
      expect(problemsOf(MODEL, { NODE_IP: bad }), bad).toEqual([
        `NODE_IP: expected this host's IP address or DNS name (Kubernetes: status.hostIP), got ${JSON.stringify(bad)}; fix or unset it`
      ])
  })

  it("CGN_LOG_LEVEL that names no level is refused (it would be passed over silently); any case is a level", () => {
    expect(problemsOf(MODEL, { CGN_LOG_LEVEL: "verbose" })).toEqual([
      'CGN_LOG_LEVEL: expected "trace", "debug", "info", "warn", "error" (it overrides agent.log_level), got "verbose"; fix or unset it'
    ])
    expect(problemsOf(MODEL, { CGN_LOG_LEVEL: "DEBUG" })).toEqual([])
    expect(problemsOf(MODEL, { CGN_LOG_LEVEL: "" })).toEqual([])
  })
  it("the error names the file and lists one problem per line", () => {
    const r = decodeConfig(`[agent]\nrole = "x"\n${MODEL}`, "/etc/cgn/agent.toml", {})
    expect(Result.isFailure(r) && r.failure.message).toBe(
      'invalid config /etc/cgn/agent.toml:\n  agent.role: expected one of "prefill", "decode", "both", got "x"'
    )
  })
})

describe("defaults", () => {
  it("a file with only a model gets every default", () => {
    const r = decodeConfig(MODEL, "min.toml", { NODE_NAME: "gpu-7" })
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    const c = r.success
    expect(c.file).toBe("min.toml")
    expect(c.cluster).toEqual({ name: "default", etcd: [], etcd_prefix: "/cgn" })
    expect(c.security).toEqual({ require_mtls: false })
    expect(c.agent.listen_grpc).toBe("0.0.0.0:7071")
    expect(c.agent.listen_admin).toBe("127.0.0.1:9091")
    expect(Duration.toMillis(c.agent.heartbeat)).toBe(5000)
    expect(Duration.toMillis(c.agent.lease_ttl)).toBe(15000)
    expect(Duration.toMillis(c.agent.drain_timeout)).toBe(30000)
    expect(c.agent.role).toBe("both")
    expect(c.agent.node_id).toBe("gpu-7")
    expect(c.agent.ready_probe_url).toBeUndefined()
    expect([c.agent.max_inflight, c.agent.max_queue, c.agent.state_dir]).toEqual([256, 1024, "/var/lib/cgn-agent"])
    expect([c.engine.kind, c.engine.url, c.engine.kv_offload]).toEqual(["vllm", "http://127.0.0.1:8000", "none"])
    expect([c.engine.command, c.engine.args, c.engine.env]).toEqual([undefined, [], {}])
    expect(Duration.toMillis(c.engine.startup_timeout)).toBe(30 * 60_000)
    expect(Duration.toMillis(c.engine.stop_grace)).toBe(30_000)
    expect(c.model).toEqual({
      name: "m",
      source: { kind: "hf_repo", value: "a/b" },
      tp: 1,
      dp: 1,
      served_name: "m",
      max_model_len: undefined,
      gpu_memory_utilization: undefined,
      args: [],
      gpus: []
    })
    expect(Duration.toMillis(c.engine.gpu_free_timeout)).toBe(2 * 60_000)
    expect(c.engine.gpu_free_below_mib).toBe(1024)
    expect([c.engine.ignore_xids, c.engine.fault_xids]).toEqual([[], []])
    expect(c.kv).toEqual({
      events: false,
      events_endpoint: "tcp://127.0.0.1:5557",
      topic: "kv-events",
      block_size: 16,
      max_queue_bytes: 32 * 1024 * 1024
    })
  })

  it("node_id: the key, else NODE_NAME, else the hostname", () => {
    const id = (text: string, env: Record<string, string>) => {
      const r = decodeConfig(text, undefined, env)
      if (Result.isFailure(r)) throw new Error(r.failure.message)
      return r.success.agent.node_id
    }
    expect(id(`[agent]\nnode_id = "n-1"\n${MODEL}`, { NODE_NAME: "k8s-node" })).toBe("n-1")
    expect(id(MODEL, { NODE_NAME: "k8s-node" })).toBe("k8s-node")
    expect(id(MODEL, { NODE_NAME: "" })).toBe(os.hostname())
    expect(id(MODEL, {})).toBe(os.hostname())
  })

  it("node_id from NODE_NAME or the hostname is checked as the key is, and the error says where it came from", () => {
    expect(problemsOf(MODEL, { NODE_NAME: "rack-1/gpu-7" })).toEqual([
      'agent.node_id: not set, so it comes from NODE_NAME: expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got "rack-1/gpu-7"; set agent.node_id'
    ])
    expect(problemsOf(MODEL, { NODE_NAME: "gpu-7\n" })).toEqual([
      'agent.node_id: not set, so it comes from NODE_NAME: expected a name without "/" or control characters (it is one part of the etcd key <etcd_prefix>/<name>/nodes/<node_id>), got "gpu-7\\n"; set agent.node_id'
    ])
    // the key in the file wins, so a bad NODE_NAME is never used
    expect(problemsOf(`[agent]\nnode_id = "n-1"\n${MODEL}`, { NODE_NAME: "a/b" })).toEqual([])
  })

  it("durations accept ms, s, m and h", () => {
    const r = decodeConfig(
      `[agent]\nheartbeat = "500ms"\nlease_ttl = "2m"\ndrain_timeout = "1h"\n[engine]\nstop_grace = "45s"\n${MODEL}`,
      undefined,
      {}
    )
    if (Result.isFailure(r)) throw new Error(r.failure.message)
    const c = r.success
    expect(
      [c.agent.heartbeat, c.agent.lease_ttl, c.agent.drain_timeout, c.engine.stop_grace].map(Duration.toMillis)
    ).toEqual([500, 120_000, 3_600_000, 45_000])
  })
})

describe("reading the file", () => {
  let dir = ""
  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-config-"))
  })
  afterAll(async () => {
    await fs.rm(dir, { recursive: true, force: true })
  })

  it("loads a file from disk", async () => {
    const file = path.join(dir, "ok.toml")
    await fs.writeFile(file, MODEL)
    const c = await Effect.runPromise(loadConfigFile(file))
    expect([c.file, c.model.name]).toEqual([file, "m"])
  })

  it("a missing file is a ConfigError naming it", async () => {
    const file = path.join(dir, "missing.toml")
    const exit = await Effect.runPromiseExit(loadConfigFile(file))
    expect(Exit.isFailure(exit)).toBe(true)
    const message = Exit.isFailure(exit) ? String(exit.cause) : ""
    expect(message).toContain(`invalid config ${file}`)
    expect(message).toContain("cannot read file: ENOENT")
  })

  it("only a regular file is read: a FIFO (whose open would block for ever), a directory, a huge file", async () => {
    const fifo = path.join(dir, "config.fifo")
    await new Promise<void>((resolve, reject) =>
      execFile("mkfifo", [fifo], (error) => (error === null ? resolve() : reject(error)))
    )
    const huge = path.join(dir, "huge.toml")
    await fs.writeFile(huge, `# ${"x".repeat(1024 * 1024)}\n${MODEL}`)
    const problemOf = async (file: string) => {
      const exit = await Effect.runPromiseExit(loadConfigFile(file))
      return Exit.isFailure(exit) ? String(exit.cause) : "read"
    }
    expect(await problemOf(fifo)).toContain(
      "cannot read file: a FIFO (named pipe), not a regular file; the config path (--config, else CGN_AGENT_CONFIG) must name a TOML file"
    )
    expect(await problemOf(dir)).toContain("cannot read file: a directory, not a regular file")
    expect(await problemOf(huge)).toContain("more than a config's 1048576 (1 MiB); is it the right file?")
    // ... and a file of exactly 1 MiB is read
    const full = path.join(dir, "full.toml")
    await fs.writeFile(full, `${MODEL}# ${"x".repeat(1024 * 1024 - MODEL.length - 3)}\n`)
    expect((await fs.stat(full)).size).toBe(1024 * 1024)
    expect(await problemOf(full)).toBe("read")
    // a symbolic link to a regular file (a Kubernetes ConfigMap's mount) is read
    const link = path.join(dir, "link.toml")
    await fs.writeFile(path.join(dir, "target.toml"), MODEL)
    await fs.symlink("target.toml", link)
    expect(await problemOf(link)).toBe("read")
  })

  it("bytes that are not UTF-8: a ConfigError naming the file, the line and the column (no U+FFFD in a value)", async () => {
    const file = path.join(dir, "latin1.toml")
    // "café" written in Latin-1 (0xe9), on line 2 after `node_id = "caf`: column 15
    await fs.writeFile(
      file,
      Buffer.concat([Buffer.from('[agent]\nnode_id = "caf'), Buffer.from([0xe9]), Buffer.from(`"\n${MODEL}`)])
    )
    const exit = await Effect.runPromiseExit(loadConfigFile(file))
    const message = Exit.isFailure(exit) ? String(exit.cause) : ""
    expect(message).toContain(
      `invalid config ${file}:\n  line 2, column 15: invalid UTF-8 (byte 0xe9 at offset 22); save the file as UTF-8`
    )
  })

  it("UTF-8 errors: the column counts characters, a cut sequence is found where it starts, a BOM is allowed", () => {
    const problems = (...parts: ReadonlyArray<string | ReadonlyArray<number>>) => {
      const bytes = Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p) : Buffer.from(p))))
      const r = decodeConfigBytes(bytes, "f.toml", {})
      return Result.isFailure(r) ? r.failure.problems : []
    }
    // é (2 bytes) is one column; E2 82 is the start of a 3-byte "€" cut short by the quote
    expect(problems('a = "é', [0xe2, 0x82], '"\n')).toEqual([
      "line 1, column 7: invalid UTF-8 (byte 0xe2 at offset 7); save the file as UTF-8"
    ])
    // a lead byte at the end of the file
    expect(problems('a = "x"\n', [0xc3])).toEqual([
      "line 2, column 1: invalid UTF-8 (byte 0xc3 at offset 8); save the file as UTF-8"
    ])
    expect(problems([0xef, 0xbb, 0xbf], MODEL)).toEqual([])
  })

  it("the path comes from --config, else CGN_AGENT_CONFIG; none or an empty one is a ConfigError", () => {
    const saved = process.env.CGN_AGENT_CONFIG
    const path = (flag: Option.Option<string>, env: string | undefined) => {
      if (env === undefined) delete process.env.CGN_AGENT_CONFIG
      else process.env.CGN_AGENT_CONFIG = env
      return Effect.runSync(Effect.result(configPath(flag)))
    }
    try {
      expect(path(Option.some("a.toml"), "b.toml")).toEqual(Result.succeed("a.toml"))
      expect(path(Option.none(), "b.toml")).toEqual(Result.succeed("b.toml"))
      for (const [flag, env] of [
        [Option.none(), undefined],
        [Option.none(), ""],
        [Option.some(""), "b.toml"]
      ] as const) {
        const r = path(flag, env)
        expect(Result.isFailure(r) && r.failure._tag).toBe("ConfigError")
      }
      // a path of only whitespace is as empty (not a missing file named " "), and the flag's is not replaced by the env's
      for (const given of ["", "  ", "\t"]) {
        const r = path(Option.some(given), "b.toml")
        expect(Result.isFailure(r) && [r.failure.file, r.failure.problems]).toEqual([
          JSON.stringify(given),
          ["--config: the path is empty; pass --config PATH (an unset variable in --config=$VAR?)"]
        ])
      }
    } finally {
      if (saved === undefined) delete process.env.CGN_AGENT_CONFIG
      else process.env.CGN_AGENT_CONFIG = saved
    }
  })
})

// Malformed files of every shape: never an exception, always one problem per line that starts with where it
// is (a key path, or a TOML line and column). Arrays of tables once crashed describe() (String() on smol-toml's
// null-prototype tables) and "0.0000001s" crashed Duration; both are among the named cases.
const NAMED: ReadonlyArray<[string, string, string]> = [
  ["[[agent]]", `[[agent]]\nnode_id = "x"\n${MODEL}`, "agent: expected a table, got an array of tables"],
  ['[[models."x"]]', '[[models."x"]]\nhf_repo = "a/b"\n', 'models."x": expected a table, got an array of tables'],
  [
    "env = { A = [{ b = 1 }] }",
    `[engine]\nenv = { A = [{ b = 1 }] }\n${MODEL}`,
    "engine.env.A: expected a string, got an array of tables"
  ],
  [
    'heartbeat = "0.0000001s"',
    `[agent]\nheartbeat = "0.0000001s"\n${MODEL}`,
    'agent.heartbeat: expected a duration of at least 1ms (or 0), got "0.0000001s"'
  ],
  // a duration too long to count was told "expected a duration such as ..." of a value that is one
  [
    'heartbeat = "99999999999d"',
    `[agent]\nheartbeat = "99999999999d"\n${MODEL}`,
    'agent.heartbeat: expected a duration the agent can count in milliseconds (at most 104249991d), got "99999999999d"'
  ],
  [
    'stop_grace = "0.0000001s"',
    `[engine]\nstop_grace = "0.0000001s"\n${MODEL}`,
    "engine.stop_grace: expected a duration"
  ]
]

const SEGMENT = String.raw`(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*")(?:\[\d+\])*`
const WHERE = new RegExp(String.raw`^(?:line \d+, column \d+|<root>|${SEGMENT}(?:\.${SEGMENT})*): \S`)

/** Fails the test unless decoding returns (never throws) and every problem names where it is. */
const expectKeyedProblems = (text: string): "ok" | "bad" => {
  let r: ReturnType<typeof decodeConfig>
  try {
    r = decodeConfig(text, "fuzz.toml", {})
  } catch (e) {
    throw new Error(`decodeConfig threw ${(e as Error).message} on:\n${text}`)
  }
  if (Result.isSuccess(r)) return "ok"
  for (const p of r.failure.problems) {
    if (!WHERE.test(p) || /cannot decode|\[object|undefined/.test(p)) {
      throw new Error(`problem without a key path and reason: ${JSON.stringify(p)} in:\n${text}`)
    }
  }
  return "bad"
}

const VALUES = [
  '"x"',
  '""',
  '"5s"',
  '"0.0000001s"',
  '"1e-7s"',
  '"99999999999999999999d"',
  '"http://h:1"',
  '"0.0.0.0:7071"',
  "0",
  "-1",
  "1",
  "9223372036854775807",
  "0.5",
  "1e308",
  "inf",
  "nan",
  "true",
  "false",
  "1979-05-27T07:32:00Z",
  "1979-05-27",
  "07:32:00",
  "[]",
  "[1, 2]",
  '["a", "b"]',
  "[[1], [2]]",
  "[{ b = 1 }]",
  "{}",
  "{ a = 1 }",
  "{ A = [{ b = 1 }] }",
  "{ a = { b = [] } }"
]
const SECTIONS = ["cluster", "security", "agent", "engine", "kv", 'models."m"', 'models."x y"', "models", "nope"]

const mutate = (text: string, rand: () => number): string => {
  const pick = <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(rand() * xs.length)]!
  const lines = text.split("\n")
  const at = Math.floor(rand() * (lines.length + 1))
  const line = lines[Math.min(at, lines.length - 1)] ?? ""
  switch (Math.floor(rand() * 7)) {
    case 0: // a key's value becomes a value of another type
      if (/^\s*[\w"-]+\s*=/.test(line)) lines[at] = `${line.slice(0, line.indexOf("="))}= ${pick(VALUES)}`
      break
    case 1: // a table header becomes an array-of-tables header
      if (/^\[[^[]/.test(line)) lines[at] = `[${line.trim()}]`
      break
    case 2: // a new table or array of tables with a known key
      lines.splice(
        at,
        0,
        rand() < 0.5 ? `[${pick(SECTIONS)}]` : `[[${pick(SECTIONS)}]]`,
        `${pick(knownKeys.agent!)} = ${pick(VALUES)}`
      )
      break
    case 3: {
      // a known key of some section, with a value of any type
      const keys = Object.values(knownKeys).flat()
      lines.splice(at, 0, `${pick(keys)} = ${pick(VALUES)}`)
      break
    }
    case 4: // a duplicated line (often a duplicate key or table: a TOML error)
      lines.splice(at, 0, line)
      break
    case 5:
      lines.splice(at, 1)
      break
    default: // a stray character
      lines[at] = `${line.slice(0, 3)}${pick(["[", "]", "=", '"', "{", ".", ","])}${line.slice(3)}`
  }
  return lines.join("\n")
}

describe("malformed files never crash the decoder", () => {
  it.each(NAMED)("%s: the key path and the reason", (_what, text, line) => {
    const problems = problemsOf(text)
    expect(problems.some((p) => p.startsWith(line))).toBe(true)
    expect(expectKeyedProblems(text)).toBe("bad")
  })

  it("600 mutated files (seeded): each decodes or lists keyed problems", async () => {
    const examples = await fs.readdir(path.join(import.meta.dirname, "..", "..", "examples"))
    const seeds = [MODEL]
    for (const f of examples.filter((e) => e.endsWith(".toml"))) {
      seeds.push(await fs.readFile(path.join(import.meta.dirname, "..", "..", "examples", f), "utf8"))
    }
    const rand = prng(15)
    const tally = { ok: 0, bad: 0 }
    for (let i = 0; i < 600; i++) {
      let text = seeds[i % seeds.length]!
      const rounds = 1 + Math.floor(rand() * 4)
      for (let j = 0; j < rounds; j++) text = mutate(text, rand)
      tally[expectKeyedProblems(text)]++
    }
    // The mutations must mostly break files, or the test checks little.
    expect(tally.bad).toBeGreaterThan(300)
  })

  it("dist/main.js check: exit 2 with the key path, no stack trace", async () => {
    requireDist()
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "cgn-config-fuzz-"))
    try {
      const runs = await Promise.all(
        NAMED.slice(0, 4).map(async ([_what, text], i) => {
          const file = path.join(dir, `named-${i}.toml`)
          await fs.writeFile(file, text)
          return checkDist(file)
        })
      )
      for (const [i, r] of runs.entries()) {
        expect({ code: r.code, stdout: r.stdout }).toEqual({ code: 2, stdout: "" })
        expect(r.stderr).toContain(NAMED[i]![2])
        expect(r.stderr).not.toMatch(/TypeError|\n\s+at /)
      }
    } finally {
      await fs.rm(dir, { recursive: true, force: true })
    }
  }, 180_000)
})

/** `node dist/main.js check --config FILE`, the way a user runs it. */
const checkDist = (file: string): Promise<{ code: number; stdout: string; stderr: string }> =>
  new Promise((resolve) => {
    execFile(process.execPath, [agentEntry, "check", "--config", file], (error, stdout, stderr) =>
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, stdout, stderr })
    )
  })

describe("an etcd endpoint with credentials in it: refused, and no message echoes its password", () => {
  it.each([
    ["without a port", "https://user:hunter2@10.0.0.5", 'got "https://user:<redacted>@10.0.0.5", which has no port'],
    ["on port 0", "https://user:hunter2@10.0.0.5:0", 'got "https://user:<redacted>@10.0.0.5:0": port 0 is none'],
    [
      "with a path after the port",
      "https://user:hunter2@10.0.0.5:2379/v3",
      'got "https://user:<redacted>@10.0.0.5:2379/v3"'
    ]
  ])("%s", (_what, url, said) => {
    const problems = problemsOf(`[cluster]\netcd = ["${url}"]\n${MODEL}`)
    expect(problems).toContain(
      "cluster.etcd[0]: credentials do not belong in the URL; set cluster.etcd_username and cluster.etcd_password instead"
    )
    expect(problems.some((p) => p.includes(said))).toBe(true)
    for (const p of problems) expect(p).not.toContain("hunter2")
  })
})
