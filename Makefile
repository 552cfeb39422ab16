# Hasten: two commands set everything up on a fresh machine.
#   make demo   build, index a corpus, run a cloud index and edges on loopback, compare
#   make test   every test
SHELL := /bin/bash
.DEFAULT_GOAL := help

MODEL_DIR ?= models/all-MiniLM-L6-v2
LM_DIR ?= models/lm
# Client libraries the tests drive Hasten with (Python venvs: the OpenAI SDK; LangChain and
# LlamaIndex).
TOOLS_DIR ?= models/tools
DATA_DIR ?= ../shared/data
CARGO ?= cargo
export HASTEN_MODEL_DIR ?= $(abspath $(MODEL_DIR))
export HASTEN_LM_DIR ?= $(abspath $(LM_DIR))
export HASTEN_OPENAI_PYTHON ?= $(abspath $(TOOLS_DIR))/openai-venv/bin/python
export HASTEN_RAG_CLIENTS_PYTHON ?= $(abspath $(TOOLS_DIR))/rag-clients-venv/bin/python
# llama.cpp's server (xllamacpp), the real engine of tests/tests/engine.rs.
export HASTEN_LLAMA_SERVER_PYTHON ?= $(abspath $(TOOLS_DIR))/llama-server-venv/bin/python
# Prometheus and promtool (Debian's package) and the chart's rules rendered for the
# monitoring test (tests/tests/monitoring.rs).
export HASTEN_PROMETHEUS_DIR ?= $(abspath $(TOOLS_DIR))/prometheus-deb/usr/bin
# (Not HASTEN_TEST_*: hasten-core's configuration tests read that prefix.)
export HASTEN_RULES_FILE ?= $(abspath $(TOOLS_DIR))/test-rules/rules.yaml

# The serving image (Dockerfile): `make image IMAGE=registry.example.com/hasten:0.1.0`, then
# push it with the same tool. Needs a container engine that can pull the base images.
CONTAINER ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE ?= ghcr.io/hasten-rag/hasten:0.1.0
# The GPU workers' image (Dockerfile.cuda), for one GPU architecture (CUDA_COMPUTE_CAP).
IMAGE_CUDA ?= ghcr.io/hasten-rag/hasten:0.1.0-cuda
CUDA_COMPUTE_CAP ?= 90

.PHONY: help deps models models-large clients monitoring build demo test test-answers-large lint fmt crd config-schemas image image-cuda

help:
	@echo "make demo   run Hasten end to end on loopback and print the comparison"
	@echo "make test   run every test (installs what is missing first)"
	@echo "make lint   rustfmt and clippy, warnings as errors"

deps:
	@scripts/install-deps.sh

models: $(MODEL_DIR)/libonnxruntime.so $(LM_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf \
	$(LM_DIR)/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

# The encoder's weights, its ONNX graph and ONNX Runtime (the library comes last).
$(MODEL_DIR)/libonnxruntime.so: scripts/fetch-model.sh scripts/export-encoder-onnx.py
	scripts/fetch-model.sh $(MODEL_DIR)

# SmolLM2-135M (the tests' model and the drafter) and Qwen2.5-Coder-0.5B (~490 MB: the
# answering model, chosen by docs/benchmarks/answers.md's model table).
$(LM_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf $(LM_DIR)/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf &:
	scripts/fetch-lm.sh $(LM_DIR)

# The larger model (~1.1 GB): Qwen2.5-Coder-1.5B-Instruct, for benchmarks.
models-large: models
	scripts/fetch-lm.sh $(LM_DIR) large

clients:
	scripts/install-test-clients.sh $(abspath $(TOOLS_DIR))

monitoring:
	scripts/fetch-prometheus.sh $(abspath $(TOOLS_DIR)) >/dev/null
	scripts/render-rules.sh $(abspath $(TOOLS_DIR))/test-rules >/dev/null

build: deps
	$(CARGO) build --workspace --bins

demo: deps models build
	DATA_DIR=$(DATA_DIR) scripts/demo.sh

# `--tests` builds the binaries the integration tests spawn with the same feature set as
# `cargo test` (dev-dependencies switch on figment's `test`, hasten-lm's `testing`, kube's
# `cel`, tokio's `test-util`), so the test step reuses this build instead of compiling the
# workspace again.
test: deps models clients monitoring
	$(CARGO) build --workspace --bins --tests
	$(CARGO) test --workspace --no-fail-fast

# The answer surface's tests (the client libraries, cancellation, refusals, accounting,
# query rewriting) again on Qwen2.5-Coder-0.5B-Instruct (`make models-large`).
test-answers-large: deps models-large clients
	$(CARGO) build --workspace --bins --tests
	HASTEN_ANSWER_MODEL=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf $(CARGO) test -p hasten-tests \
		--no-fail-fast --test chat_clients --test answer_surface --test answers

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# The KvWorkerPool CRD in the chart, regenerated from its Rust type (a test fails when they
# differ).
crd:
	$(CARGO) run --quiet -p hasten-kv-operator --bin kv-operator -- crd > helm/hasten/crds/kvworkerpools.hasten.dev.yaml

# Every binary's configuration schema (docs/config-schemas/), the chart's values schema that
# embeds four of them and the configuration reference made from them; a test checks the
# schemas are current and check-helm the two generated files.
config-schemas:
	$(CARGO) run --quiet -p hasten-edge-node --bin edge-node -- serve --print-config-schema > docs/config-schemas/edge.json
	$(CARGO) run --quiet -p hasten-cloud-index --bin cloud-index -- serve --print-config-schema > docs/config-schemas/shard.json
	$(CARGO) run --quiet -p hasten-cloud-index --bin cloud-index -- route --print-config-schema > docs/config-schemas/router.json
	$(CARGO) run --quiet -p hasten-control-plane --bin control-plane -- --print-config-schema > docs/config-schemas/control-plane.json
	$(CARGO) run --quiet -p hasten-kv-worker --bin kv-worker -- serve --print-config-schema > docs/config-schemas/kv-worker.json
	$(CARGO) run --quiet -p hasten-lm-worker --bin lm-worker -- serve --print-config-schema > docs/config-schemas/lm-worker.json
	$(CARGO) run --quiet -p hasten-kv-operator --bin kv-operator -- run --print-config-schema > docs/config-schemas/kv-operator.json
	$(CARGO) run --quiet -p hasten-admin --bin hasten-admin -- --print-config-schema > docs/config-schemas/admin.json
	python3 scripts/gen-values-schema.py
	python3 scripts/gen-config-reference.py

image:
	$(CONTAINER) build -t $(IMAGE) .

image-cuda:
	$(CONTAINER) build -f Dockerfile.cuda --build-arg CUDA_COMPUTE_CAP=$(CUDA_COMPUTE_CAP) -t $(IMAGE_CUDA) .
