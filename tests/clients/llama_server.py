#!/usr/bin/env python3
"""llama.cpp's HTTP server (the native one, embedded in the xllamacpp wheel) on loopback, for
the engine tests: a real OpenAI-compatible engine serving a GGUF.

usage: llama_server.py MODEL.gguf --ready-file PATH [--port 0] [--ctx 8192] [--parallel 2]

Writes {"http_addr": "127.0.0.1:PORT"} to the ready file once the model is loaded and the
server listens (the contract of Hasten's own binaries), then serves until SIGTERM.
"""
import argparse
import json
import os
import signal
import sys
import threading

import xllamacpp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=8192, help="KV cells, shared by the slots")
    parser.add_argument("--parallel", type=int, default=2, help="requests decoded at once")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alias", default=None, help="the model's name in the API")
    args = parser.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cont_batching = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_gpu_layers = 0
    params.endpoint_slots = True
    params.endpoint_metrics = True
    if args.alias:
        params.model_alias = {args.alias}

    # Returns once the model is loaded and the socket listens.
    server = xllamacpp.Server(params)
    address = server.listening_address
    host_port = address.split("://", 1)[-1].rstrip("/")
    partial = args.ready_file + ".partial"
    with open(partial, "w") as ready:
        json.dump({"http_addr": host_port}, ready)
    os.replace(partial, args.ready_file)
    print(f"llama.cpp server listening on {address}", file=sys.stderr, flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
