/**
 * The NVML worker thread (node:worker_threads) the daemon's Nvml layer starts (layers/node/Nvml.ts, which is
 * handed this file's path: programPaths.ts). It owns the koffi binding of libnvidia-ml, so a slow or hung NVML
 * call (nvmlInit_v2 without persistence mode, a GPU fallen off the bus) blocks this thread and never the main one,
 * which relays every token and renews the etcd lease. One reply per request, in order (layers/node/nvmlSession.ts).
 * Nothing here loads `effect`: V8 keeps every loaded module's source in this thread's heap as well.
 */
import { parentPort } from "node:worker_threads"
import koffi from "koffi"
import { type NvmlRequest, nvmlSession } from "../layers/node/nvmlSession.ts"

const port = parentPort
if (port === null) throw new Error("nvmlWorker runs as a worker thread of the agent, not as a program")
const answer = nvmlSession(koffi)
port.on("message", (request: NvmlRequest) => {
  port.postMessage(answer(request))
  // NVML is shut down: closing the port leaves the thread nothing to wait for, so it ends.
  if (request.op === "close") port.close()
})
