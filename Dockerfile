# cgn-agent container image. Not built in this repository's CI (no container engine there); the stages
# are plain npm + Debian steps, checked by reading and by `npm run build` outside a container.
#
#   docker build -t cgn-agent .                      # the agent alone (openai_compat, or the simulator)
#   docker build --target vllm -t cgn-agent:vllm .   # the agent inside the vLLM image, which it supervises
#
# PID 1 is tini: the agent runs the engine as a process group and kills it on shutdown, but a container
# PID 1 must also reap orphans (an engine's grandchildren that outlive their parent become zombies
# otherwise, and zombies look alive to a pid check).

# ---- build: full toolchain, dev dependencies, TypeScript -> dist/ ------------------------------------
FROM node:24-bookworm AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY scripts ./scripts
COPY proto ./proto
COPY src ./src
RUN npm run build \
 && npm prune --omit=dev --no-audit --no-fund

# ---- vllm: the same agent inside the vLLM image (the engine must be in the agent's container) --------
# Pin the vLLM tag you validated; the agent only needs `vllm` on PATH and Node 24 copied in.
# (Listed before `runtime` so that a plain `docker build .` still builds the slim image, the last stage.)
FROM vllm/vllm-openai:latest AS vllm
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=node:24-bookworm-slim /usr/local/bin/node /usr/local/bin/node
WORKDIR /opt/cgn-agent
ENV NODE_ENV=production
COPY --from=build /src/package.json ./package.json
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY proto ./proto
COPY examples ./examples
RUN mkdir -p /var/lib/cgn-agent /etc/cgn-agent && chown 1000:1000 /var/lib/cgn-agent
USER 1000
EXPOSE 7071 9091
# The vLLM image's own entrypoint starts the API server; replace it with the agent, which starts vLLM.
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/opt/cgn-agent/dist/main.js"]
CMD ["run", "--config", "/etc/cgn-agent/agent.toml"]

# ---- runtime: slim Node 24, tini, non-root ---------------------------------------------------------
FROM node:24-bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cgn-agent
ENV NODE_ENV=production
COPY --from=build /src/package.json ./package.json
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY proto ./proto
COPY examples ./examples
# state_dir holds the engine pid file (orphan reclaim after an agent crash): writable by the agent user.
RUN mkdir -p /var/lib/cgn-agent /etc/cgn-agent && chown node:node /var/lib/cgn-agent
USER node
# 7071: gRPC (Agent, grpc.health.v1, reflection). 9091: admin HTTP (/metrics, /healthz, /readyz, /status, /drain).
EXPOSE 7071 9091
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/opt/cgn-agent/dist/main.js"]
CMD ["run", "--config", "/etc/cgn-agent/agent.toml"]
