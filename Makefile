# Hasten: two commands set everything up on a fresh machine.
#   make demo   build, index a corpus, run a cloud index and edges on loopback, compare
#   make test   every test
SHELL := /bin/bash
.DEFAULT_GOAL := help

MODEL_DIR ?= models/all-MiniLM-L6-v2
DATA_DIR ?= ../shared/data
CARGO ?= cargo
export HASTEN_MODEL_DIR ?= $(abspath $(MODEL_DIR))

.PHONY: help deps models build demo test lint fmt

help:
	@echo "make demo   run Hasten end to end on loopback and print the comparison"
	@echo "make test   run every test (installs what is missing first)"
	@echo "make lint   rustfmt and clippy, warnings as errors"

deps:
	@scripts/install-deps.sh

models: $(MODEL_DIR)/model.safetensors

$(MODEL_DIR)/model.safetensors:
	scripts/fetch-model.sh $(MODEL_DIR)

build: deps
	$(CARGO) build --workspace --bins

demo: deps models build
	DATA_DIR=$(DATA_DIR) scripts/demo.sh

test: deps models
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
