#!/usr/bin/env python3
"""vLLM's scoring routes in front of a llama.cpp server, for the engine tests.

No vLLM can run on these machines (its wheels need CUDA and torch), so this stands in for
the part of its API Speculative RAG's verifier reads, in vLLM's request and reply shapes
(vllm/entrypoints/openai/protocol.py): POST /tokenize of chat messages or of a prompt,
POST /detokenize, POST /v1/completions of a token-id prompt with `prompt_logprobs`, with
`echo` + `logprobs`, or continued greedily with `return_tokens_as_token_ids` (RaLMSpec's
and SpecHop's steps), and GET /v1/models. The numbers are not made up: every log-probability
is the real model's, read from the llama.cpp server at ENGINE (text forced by a grammar of
token ids, marker tokens by a logit bias), and every token id is its tokenizer's. It answers no llama.cpp route (no /props), so Hasten
detects it as vLLM, not as llama.cpp.

usage: vllm_shim.py ENGINE_ADDR --ready-file PATH [--port 0] [--without-prompt-logprobs]

--without-prompt-logprobs refuses `prompt_logprobs` with a 400, as an OpenAI-compatible
server without vLLM's extension does, leaving `echo` + `logprobs`.
"""
import argparse
import json
import os
import re
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def call(engine, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{engine}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply)


SPECIAL = re.compile(r"<\|[^|]*\|>")


class Tokens:
    """Which token ids are markers (`<|im_end|>`), by their text, asked once each."""

    def __init__(self, engine):
        self.engine = engine
        self.markers = {}
        self.lock = threading.Lock()

    def is_marker(self, token):
        with self.lock:
            if token not in self.markers:
                text = call(self.engine, "/detokenize", {"tokens": [token]})["content"]
                self.markers[token] = bool(SPECIAL.fullmatch(text))
            return self.markers[token]


def scored_token(engine, prefix, token):
    """`token`'s log-probability after `prefix`, written by a logit bias. llama.cpp reports
    the model's log-probability before the sampler's bias, and a grammar cannot force an
    end-of-turn token before it ends."""
    written = call(engine, "/completion", {
        "prompt": prefix, "n_predict": 1, "n_probs": 1, "temperature": 0.0,
        "logit_bias": [[token, 1000.0]], "cache_prompt": True,
    })["completion_probabilities"][0]
    if written["id"] != token:
        raise RuntimeError(f"biased towards {token}, the engine wrote {written['id']}")
    return written["logprob"]


def forced_scores(engine, prefix, tokens):
    """The log-probabilities of `tokens` after `prefix`, forced by a grammar of their ids."""
    grammar = "root ::= " + " ".join(f"<[{i}]>" for i in tokens)
    forced = call(engine, "/completion", {
        "prompt": prefix, "n_predict": len(tokens), "n_probs": 1, "temperature": 0.0,
        "grammar": grammar, "cache_prompt": True,
    })["completion_probabilities"]
    if [p["id"] for p in forced] != tokens:
        raise RuntimeError(f"forced {tokens}, the engine wrote {[p['id'] for p in forced]}")
    return [p["logprob"] for p in forced]


def prompt_scores(engine, markers, ids):
    """The log-probability of each of ids[1:] after the ones before it (runs of text forced
    by a grammar, each marker token by a logit bias), and the greedy token after them."""
    scores = []
    start = 1
    while start < len(ids):
        if markers.is_marker(ids[start]):
            scores.append(scored_token(engine, ids[:start], ids[start]))
            start += 1
            continue
        end = start
        while end < len(ids) and not markers.is_marker(ids[end]):
            end += 1
        scores.extend(forced_scores(engine, ids[:start], ids[start:end]))
        start = end
    after = call(engine, "/completion", {
        "prompt": ids, "n_predict": 1, "n_probs": 1, "temperature": 0.0, "cache_prompt": True,
    })["completion_probabilities"][0]
    return scores, after


class Shim(BaseHTTPRequestHandler):
    engine = ""
    markers = None
    prompt_logprobs = True

    def log_message(self, *args):
        print(self.address_string(), *args, file=sys.stderr, flush=True)

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status, message):
        self.reply(status, {"error": {"message": message, "type": "BadRequestError",
                                      "param": None, "code": status}})

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, call(self.engine, "/v1/models"))
        else:
            self.refuse(404, "Not Found")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        try:
            if self.path == "/tokenize":
                self.reply(200, self.tokenize(body))
            elif self.path == "/detokenize":
                text = call(self.engine, "/detokenize", {"tokens": body["tokens"]})["content"]
                self.reply(200, {"prompt": text})
            elif self.path == "/v1/completions":
                self.completions(body)
            else:
                self.refuse(404, "Not Found")
        except urllib.error.HTTPError as error:
            self.refuse(error.code, error.read().decode(errors="replace"))
        except (KeyError, TypeError, ValueError) as error:
            self.refuse(400, f"{type(error).__name__}: {error}")

    def tokenize(self, body):
        if "messages" in body:
            if not body.get("add_generation_prompt", True):
                raise ValueError("the shim lays out chats with the assistant's turn opened")
            text = call(self.engine, "/apply-template", {"messages": body["messages"]})["prompt"]
            add_special = body.get("add_special_tokens", False)
        else:
            text = body["prompt"]
            add_special = body.get("add_special_tokens", True)
        tokens = call(self.engine, "/tokenize", {
            "content": text, "add_special": add_special, "parse_special": True,
        })["tokens"]
        return {"count": len(tokens), "max_model_len": 8192, "tokens": tokens}

    def completions(self, body):
        ids = body.get("prompt")
        if not (isinstance(ids, list) and len(ids) > 1 and all(isinstance(i, int) for i in ids)):
            return self.refuse(400, "the shim scores prompts of two or more token ids")
        wants_prompt = body.get("prompt_logprobs") is not None
        wants_echo = bool(body.get("echo")) and body.get("logprobs") is not None
        if wants_prompt and not self.prompt_logprobs:
            return self.refuse(400, "prompt_logprobs: extra inputs are not permitted")
        if not (wants_prompt or wants_echo):
            return self.continue_greedy(body, ids)
        scores, after = prompt_scores(self.engine, self.markers, ids)
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                  "stop_reason": None}
        if wants_prompt:
            choice["prompt_logprobs"] = [None] + [
                {str(i): {"logprob": s, "rank": None, "decoded_token": None}}
                for i, s in zip(ids[1:], scores)
            ]
        if wants_echo:
            tokens = [f"token_id:{i}" for i in ids] + [f"token_id:{after['id']}"]
            logprobs = [None] + scores + [after["logprob"]]
            choice["logprobs"] = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": logprobs,
                "tokens": tokens,
                "top_logprobs": [None] + [{t: s} for t, s in zip(tokens[1:], logprobs[1:])],
            }
        self.reply(200, {
            "id": "cmpl-shim", "object": "text_completion", "created": 0,
            "model": body.get("model", ""), "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1,
                      "total_tokens": len(ids) + 1},
        })


    def continue_greedy(self, body, ids):
        """Greedy tokens after `ids`, named by id as vLLM's `return_tokens_as_token_ids`
        names them; like vLLM, the end-of-sequence token it stopped on is listed."""
        if body.get("temperature") != 0.0 or not body.get("return_tokens_as_token_ids"):
            return self.refuse(400, "the shim continues greedily, tokens named by id")
        written = call(self.engine, "/completion", {
            "prompt": ids, "n_predict": body.get("max_tokens", 16), "n_probs": 1,
            "temperature": 0.0, "cache_prompt": False, "return_tokens": True,
        })
        names = [f"token_id:{t}" for t in written["tokens"]]
        scores = [p["logprob"] for p in written["completion_probabilities"]]
        ended = written["stop_type"] == "eos"
        self.reply(200, {
            "id": "cmpl-shim", "object": "text_completion", "created": 0,
            "model": body.get("model", ""),
            "choices": [{
                "index": 0, "text": written["content"],
                "logprobs": {"text_offset": list(range(len(names))), "token_logprobs": scores,
                             "tokens": names, "top_logprobs": [None] * len(names)},
                "finish_reason": "stop" if ended else "length", "stop_reason": None,
            }],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(names),
                      "total_tokens": len(ids) + len(names)},
        })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", help="HOST:PORT of the llama.cpp server")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--without-prompt-logprobs", action="store_true")
    args = parser.parse_args()

    Shim.engine = args.engine
    Shim.markers = Tokens(args.engine)
    Shim.prompt_logprobs = not args.without_prompt_logprobs
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Shim)
    host, port = server.server_address[:2]
    partial = args.ready_file + ".partial"
    with open(partial, "w") as ready:
        json.dump({"http_addr": f"{host}:{port}"}, ready)
    os.replace(partial, args.ready_file)
    print(f"vLLM shim on {host}:{port} over {args.engine}", file=sys.stderr, flush=True)

    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
