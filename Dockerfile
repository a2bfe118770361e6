# tessera in a container: Debian 12, built in one stage, run from a slim one as a
# non-root user. The image serves models/stories260K.gguf (shipped in the
# repository) on port 8000 unless given other arguments:
#   docker build -t tessera .
#   docker run --rm -p 8000:8000 --shm-size=1g tessera
#   docker run --rm -p 8000:8000 --shm-size=1g -v /models:/models:ro tessera \
#       serve /models/model.gguf --host 0.0.0.0 --tp 2
# --shm-size: ranks on one host talk through /dev/shm (Docker's default is 64 MiB).
# Kubernetes and Slurm: docs/deploy.md.

FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake ninja-build pkg-config \
      libhwy-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libxxhash-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake --preset release -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF \
 && cmake --build build --target tessera -j"$(nproc)"

FROM debian:12-slim AS runtime
# The shared libraries the binary links (ldd build/bin/tessera), nothing else.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libhwy1 libxxhash0 libssl3 libcpp-httplib0.11 \
      libbrotli1 zlib1g libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 tessera \
 && useradd --uid 10001 --gid tessera --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tessera
COPY --from=build /src/build/bin/tessera /usr/local/bin/tessera
COPY --from=build /src/models/stories260K.gguf /src/models/README.md /opt/tessera/models/
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/tessera"]
CMD ["serve", "/opt/tessera/models/stories260K.gguf", "--host", "0.0.0.0", "--port", "8000"]
