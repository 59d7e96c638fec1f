/**
 * How each engine marks the level of its log lines (LaunchPlan.logLevels, read by services/engine/LineLevels.ts):
 * the engine's debug is logged at debug, info at info, warning at warn, error and critical at error. A line with no
 * mark is logged at info, as every line was: a Python traceback the engine did not log (an uncaught one, on stderr),
 * a progress bar, a continuation line of a message its logger marked on its first line only (llama.cpp's; Python's
 * logging.Formatter). The run's exit is logged at error with its last lines anyway (layers/engine/EngineProcess.ts).
 */
import type { EngineLineLevel, LogLevelMarks } from "../../../services/engine/LineLevels.ts"

/** Python's logging level names (cpython Lib/logging/__init__.py), and uvicorn's TRACE (uvicorn/logging.py). */
const PYTHON_LEVELS: Readonly<Record<string, EngineLineLevel>> = {
  TRACE: "debug",
  DEBUG: "debug",
  INFO: "info",
  WARNING: "warn",
  ERROR: "error",
  CRITICAL: "error"
}
const PY = "(TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL)"

/**
 * llama.cpp's log prefix (ggml-org/llama.cpp common/log.cpp, common_log_entry::print): the time since start
 * `M.SS.mmm.uuu`, then the level letter I, W, E or D and a space. common_init (common/common.cpp) turns prefixes and
 * timestamps on, so every line llama-server logs carries both (seen from the real one: `0.00.011.237 W srv
 * llama_server: CORS is set to allow all origins ...`; a request's slot lines are I). The timestamp is required:
 * without it (`--no-log-timestamps`) a line is not told from text that begins with a capital letter and a space
 * (a continuation line, which the logger prints with no prefix), and is logged at info.
 */
export const LLAMA_CPP_MARKS: LogLevelMarks = {
  pattern: String.raw`^\d+\.\d\d\.\d{3}\.\d{3} ([IWED]) `,
  levels: { D: "debug", I: "info", W: "warn", E: "error" }
}

/**
 * vLLM's logger (vllm-project/vllm vllm/logger.py, `_FORMAT`): `LEVEL MM-DD HH:MM:SS [file.py:123] message`, every
 * line of a message so prefixed (vllm/logging_utils/formatter.py, NewLineFormatter); its HTTP server's are uvicorn's
 * default format, `LEVEL:` padded (uvicorn/logging.py, ColourizedFormatter levelprefix). Each process's output may
 * begin with its name (`(APIServer pid=1) `, `(EngineCore_DP0 pid=2) `: vllm/utils/system_utils.py, _add_prefix).
 */
export const VLLM_MARKS: LogLevelMarks = {
  pattern: String.raw`^(?:\([^()]* pid=\d+\) )?(?:${PY} \d\d-\d\d \d\d:\d\d:\d\d|${PY}: )`,
  levels: PYTHON_LEVELS
}

/**
 * SGLang's own logger writes no level (sgl-project/sglang python/sglang/srt/utils/common.py, configure_logger:
 * `[%(asctime)s{prefix}] %(message)s`): its lines are logged at info. Its HTTP server's lines carry uvicorn's level
 * after the time (set_uvicorn_logging_configs: `[%(asctime)s] %(levelprefix)s %(message)s`).
 */
export const SGLANG_MARKS: LogLevelMarks = {
  pattern: String.raw`^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ${PY}: `,
  levels: PYTHON_LEVELS
}

/**
 * mlx-lm's server configures Python's logging as `%(asctime)s - %(levelname)s - %(message)s` (ml-explore/mlx-lm
 * mlx_lm/server.py, main), asctime as `YYYY-MM-DD HH:MM:SS,mmm`; its HTTP request lines (http.server's log_message) and
 * prints carry no level.
 */
export const MLX_MARKS: LogLevelMarks = {
  pattern: String.raw`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - ${PY} - `,
  levels: PYTHON_LEVELS
}
