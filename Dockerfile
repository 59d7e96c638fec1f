# cgn-agent container image. Not built in this repository's CI (no container engine there); the stages
# are plain npm + Debian steps, checked by reading and by `npm run build` outside a container.
#
#   docker build -t cgn-agent .                      # the agent alone (openai_compat, or the simulator:
#                                                    # node /opt/cgn-agent/dist/programs/sim.js, README "Container image")
#   docker build --target vllm -t cgn-agent:vllm .   # the agent inside the vLLM image, which it supervises
#
# PID 1 is tini: the agent runs the engine as a process group and kills it on shutdown, but a container
# PID 1 must also reap orphans (an engine's grandchildren that outlive their parent become zombies
# otherwise, and zombies look alive to a pid check).

# Base images are pinned to exact versions (the Node version is package.json's `node` devDependency, the
# one the tests run on). For reproducible builds pin the digests too: `docker buildx imagetools inspect IMAGE`.
ARG NODE_IMAGE=node:24.21.0-bookworm
ARG NODE_SLIM_IMAGE=node:24.21.0-bookworm-slim
# The vLLM release the agent's vLLM renderer was checked against; bump it deliberately (see README).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.26.0
# Set by the build (`--build-arg VERSION=... --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=...`).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown

# ---- build: full toolchain, dev dependencies, TypeScript -> dist/ ------------------------------------
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY scripts ./scripts
COPY proto ./proto
COPY src ./src
RUN npm run build

# ---- deps: production dependencies only, trimmed (README "Image size") --------------------------------
# --omit=peer drops redis, a peer of @effect/platform-node that only its NodeRedis module loads;
# prune-prod.mjs removes what nothing loads (type-only packages, sources, other platforms' addons).
FROM ${NODE_IMAGE} AS deps
WORKDIR /src
COPY package.json package-lock.json ./
COPY scripts/prune-prod.mjs ./scripts/prune-prod.mjs
RUN npm ci --omit=dev --omit=peer --no-audit --no-fund \
 && node scripts/prune-prod.mjs node_modules

# ---- vllm: the same agent inside the vLLM image (the engine must be in the agent's container) --------
# The agent only needs `vllm` on PATH and Node 24 copied in.
# (Listed before `runtime` so that a plain `docker build .` still builds the slim image, the last stage.)
FROM ${NODE_SLIM_IMAGE} AS node-slim
FROM ${VLLM_IMAGE} AS vllm
ARG VERSION
ARG REVISION
ARG CREATED
ARG VLLM_IMAGE
LABEL org.opencontainers.image.title="cgn-agent (vLLM)" \
      org.opencontainers.image.description="cgn-agent supervising vLLM on a GPU host" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${VLLM_IMAGE}"
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=node-slim /usr/local/bin/node /usr/local/bin/node
WORKDIR /opt/cgn-agent
ENV NODE_ENV=production
COPY --from=build /src/package.json ./package.json
COPY --from=deps /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY proto ./proto
COPY examples ./examples
RUN mkdir -p /var/lib/cgn-agent /etc/cgn-agent && chown 1000:1000 /var/lib/cgn-agent
USER 1000
EXPOSE 7071 9091
# The vLLM image's own entrypoint starts the API server; replace it with the agent, which starts vLLM.
# --max-semi-space-size=4 (MiB): V8's young generation otherwise grows to tens of MiB under streaming load; with
# 4 MiB the agent's peak RSS at 256 streams was 169 MiB instead of 291 at the same CPU per token (docs/bench.md).
# --heap-growing-percent=50: V8 lets the old generation grow to up to 4x its live size between full GCs under its
# default heap limit (v8 src/heap/heap-controller.cc, MaxGrowingFactor); this fixes the factor at 1.5 and keeps the
# default limit. A warmed agent peaked at 204-224 MiB RSS at 256 streams and 275 at 1,000 without it, 143-146 and
# 167 with it; it costs ~15% CPU per token only where the agent's core is saturated (docs/bench.md, eighth
# session). test/programs/packaging.test.ts checks that the pinned Node accepts these flags.
# MALLOC_ARENA_MAX=1, for the agent alone (set by `env`, and not passed on to the engine: see
# src/services/engine/EngineEnvironment.ts): glibc gives every allocating thread (V8's GC and compiler workers) its
# own arena, whose freed memory stays resident; one arena lowered the agent's peak RSS by 10-22 MiB in most bench
# rows (docs/bench.md, eleventh session).
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/env", "MALLOC_ARENA_MAX=1", "node", "--disable-sigusr1", "--max-semi-space-size=4", "--heap-growing-percent=50", "/opt/cgn-agent/dist/main.js"]
CMD ["run", "--config", "/etc/cgn-agent/agent.toml"]

# ---- runtime: slim Node 24, tini, non-root ---------------------------------------------------------
FROM ${NODE_SLIM_IMAGE} AS runtime
ARG VERSION
ARG REVISION
ARG CREATED
ARG NODE_SLIM_IMAGE
LABEL org.opencontainers.image.title="cgn-agent" \
      org.opencontainers.image.description="Per-GPU-host agent of the cgn LLM serving stack" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${NODE_SLIM_IMAGE}"
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cgn-agent
ENV NODE_ENV=production
COPY --from=build /src/package.json ./package.json
COPY --from=deps /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY proto ./proto
COPY examples ./examples
# state_dir holds the engine pid file (orphan reclaim after an agent crash): writable by the agent user.
RUN mkdir -p /var/lib/cgn-agent /etc/cgn-agent && chown node:node /var/lib/cgn-agent
USER node
# 7071: gRPC (Agent, grpc.health.v1, reflection). 9091: admin HTTP (/metrics, /healthz, /readyz, /status, /drain),
# on 127.0.0.1 unless agent.listen_admin says otherwise. No health port: agent.listen_health has no default (the
# examples/k8s config puts it on 7072, which its DaemonSet declares; with hostNetwork, EXPOSE changes nothing).
EXPOSE 7071 9091
# The same Node flags and allocator setting as the vLLM stage's ENTRYPOINT (see there); npm run bench runs the
# agent with them too.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/env", "MALLOC_ARENA_MAX=1", "node", "--disable-sigusr1", "--max-semi-space-size=4", "--heap-growing-percent=50", "/opt/cgn-agent/dist/main.js"]
CMD ["run", "--config", "/etc/cgn-agent/agent.toml"]
