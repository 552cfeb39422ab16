#!/usr/bin/env python3
"""Speed peer for hasten-lm: measure llama.cpp on the same GGUF file.

This script runs llama.cpp (through the llama-cpp-python low-level ctypes
API, CPU only) on a GGUF model and reports two figures that hasten-lm's own
benchmark reports too, so the two can be put side by side on one machine:

prefill
    For each N in --prefill, a prompt of exactly N tokens (real text: a
    paragraph tokenized without BOS, repeated, cut to N) is evaluated in ONE
    llama_decode call (n_batch = n_ubatch >= N, logits only for the last
    token) on an emptied KV cache. Each N is run once untimed as warm-up,
    then --repeat times; the median tokens/s (N / wall time of llama_decode +
    llama_synchronize) is reported.

decode
    For each B in --batches, B independent sequences (seq_id 0..B-1, each with
    its own --decode-context-token prompt (16 by default) taken from a different part of the text) are
    prefilled together, then decoded greedily (argmax, llama.cpp's greedy
    sampler) for --decode-tokens steps; every step is one llama_decode call
    holding B tokens, one per sequence, logits requested for all B. EOS is
    ignored so each run does exactly the same work. The timed part is the
    --decode-tokens steps (llama_decode + greedy sampling). Reported:
    aggregate tokens/s = B * steps / time and per-sequence tokens/s =
    steps / time; median over --repeat runs after one untimed warm-up.

n_threads and n_threads_batch are both set to --threads; the KV cache is not
unified across sequences (kv_unified = false, each sequence attends only to
its own cells) and the rest of llama_context_params is llama.cpp's default
(flash attention "auto", f16 KV cache).

Usage (the venv is the one the project's tools script builds):

    $HOME/.cache/hasten-ci/tools/llama-cpp-venv/bin/python bench/lm-peer.py \
        --model FILE.gguf --threads 2 --prefill 128,512,2048 \
        --decode-tokens 64 --batches 1,5 --repeat 3 --out peer.json

Depends only on llama_cpp (llama-cpp-python) and the standard library.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time

import llama_cpp

try:
    from importlib.metadata import version as _pkg_version

    PEER_VERSION = _pkg_version("llama-cpp-python")
except Exception:  # pragma: no cover - fallback when metadata is missing
    PEER_VERSION = getattr(llama_cpp, "__version__", "unknown")


TEXT = (
    "The history of the city begins with a small settlement on the northern bank "
    "of the river, where traders from the coast met farmers from the hills. Over "
    "the following centuries the market grew into a town, and the town into a "
    "walled city with a cathedral, a university and a busy harbour. In 1842 a great "
    "fire destroyed much of the old quarter; the rebuilding that followed gave the "
    "centre its wide streets, stone bridges and public gardens. Today the city is "
    "known for its museums, its annual music festival and its railway works, which "
    "employed more than twelve thousand people at their peak. The climate is mild, "
    "with warm summers and wet winters, and the surrounding countryside produces "
    "grain, apples and a well-known white cheese. Local government is led by an "
    "elected council of forty-one members, who choose a mayor every two years. "
)


def _silence_logs():
    @llama_cpp.llama_log_callback
    def _quiet(level, text, user_data):  # noqa: ARG001
        return None

    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    return _quiet  # keep a reference alive


def tokenize(vocab, text):
    raw = text.encode("utf-8")
    cap = len(raw) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, cap, False, False)
    if n < 0:
        raise RuntimeError("llama_tokenize failed")
    return list(buf[:n])


def text_tokens(vocab, n):
    base = tokenize(vocab, TEXT)
    out = []
    while len(out) < n:
        out.extend(base)
    return out[:n]


def new_context(model, threads, n_ctx, n_batch, n_seq_max):
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_batch
    p.n_ubatch = n_batch
    p.n_seq_max = n_seq_max
    p.n_threads = threads
    p.n_threads_batch = threads
    p.kv_unified = False
    p.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    return ctx


def fill(batch, items):
    """items: list of (token, pos, seq_id, want_logits)."""
    for i, (tok, pos, seq, want) in enumerate(items):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if want else 0
    batch.n_tokens = len(items)


def decode(ctx, batch):
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")
    llama_cpp.llama_synchronize(ctx)


def bench_prefill(model, vocab, threads, sizes, repeat, n_ctx):
    nmax = max(sizes)
    ctx = new_context(model, threads, max(n_ctx, nmax), nmax, 1)
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(nmax, 0, 1)
    results = []
    try:
        for n in sizes:
            toks = text_tokens(vocab, n)
            items = [(t, i, 0, i == n - 1) for i, t in enumerate(toks)]
            times = []
            for r in range(repeat + 1):  # first run is warm-up
                llama_cpp.llama_memory_clear(mem, True)
                fill(batch, items)
                t0 = time.perf_counter()
                decode(ctx, batch)
                dt = time.perf_counter() - t0
                if r > 0:
                    times.append(dt)
            med = statistics.median(times)
            results.append({"tokens": n, "tokens_per_s": round(n / med, 2),
                            "median_s": round(med, 6)})
            print(f"  prefill {n:>5} tokens: {n / med:10.1f} tok/s", file=sys.stderr)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return results


def bench_decode(model, vocab, threads, batches, steps, repeat, n_ctx, context):
    base = text_tokens(vocab, 4096)
    sampler = llama_cpp.llama_sampler_init_greedy()
    results = []
    try:
        for b in batches:
            # per-sequence cells: prompt + steps, with slack; kv not unified,
            # so n_ctx is split evenly across the b sequences.
            need = b * (context + steps + 64)
            ctx = new_context(model, threads, max(n_ctx, need),
                              max(b * context, b), b)
            mem = llama_cpp.llama_get_memory(ctx)
            batch = llama_cpp.llama_batch_init(max(b * context, b), 0, 1)
            prompts = []
            for s in range(b):
                off = (s * 37) % (len(base) - context)
                prompts.append(base[off:off + context])
            times = []
            try:
                for r in range(repeat + 1):  # first run is warm-up
                    llama_cpp.llama_memory_clear(mem, True)
                    items = []
                    last_idx = []
                    for s, pr in enumerate(prompts):
                        for i, t in enumerate(pr):
                            items.append((t, i, s, i == len(pr) - 1))
                        last_idx.append(len(items) - 1)
                    fill(batch, items)
                    decode(ctx, batch)
                    nxt = [llama_cpp.llama_sampler_sample(sampler, ctx, idx) for idx in last_idx]
                    pos = context
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        fill(batch, [(nxt[s], pos, s, True) for s in range(b)])
                        decode(ctx, batch)
                        nxt = [llama_cpp.llama_sampler_sample(sampler, ctx, s) for s in range(b)]
                        pos += 1
                    dt = time.perf_counter() - t0
                    if r > 0:
                        times.append(dt)
            finally:
                llama_cpp.llama_batch_free(batch)
                llama_cpp.llama_free(ctx)
            med = statistics.median(times)
            agg = b * steps / med
            per = steps / med
            results.append({"batch": b, "aggregate_tokens_per_s": round(agg, 2),
                            "per_sequence_tokens_per_s": round(per, 2),
                            "steps": steps, "context": context,
                            "median_s": round(med, 6)})
            print(f"  decode batch {b}: {agg:10.1f} tok/s aggregate, {per:8.1f} tok/s per sequence",
                  file=sys.stderr)
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return results


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--prefill", type=ints, default=[128, 512, 2048])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--batches", type=ints, default=[1, 5])
    ap.add_argument("--decode-context", type=int, default=16,
                    help="prompt tokens of each decoded sequence")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log")
    a = ap.parse_args()

    keep = None if a.verbose else _silence_logs()
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(a.model.encode("utf-8"), mp)
    if not model:
        sys.exit(f"cannot load {a.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_ctx = max(max(a.prefill) + a.decode_tokens, 2048 + 64)

    print(f"llama.cpp via llama-cpp-python {PEER_VERSION}, threads={a.threads}", file=sys.stderr)
    try:
        prefill = bench_prefill(model, vocab, a.threads, a.prefill, a.repeat, n_ctx)
        dec = bench_decode(model, vocab, a.threads, a.batches, a.decode_tokens, a.repeat, n_ctx,
                           a.decode_context)
    finally:
        llama_cpp.llama_model_free(model)
        llama_cpp.llama_backend_free()
    del keep

    out = {
        "peer": f"llama.cpp (llama-cpp-python {PEER_VERSION})",
        "model": a.model,
        "threads": a.threads,
        "repeat": a.repeat,
        "n_ctx": n_ctx,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "prefill": prefill,
        "decode": dec,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")

    print(f"\nllama.cpp (llama-cpp-python {PEER_VERSION})  model={a.model}  threads={a.threads}  repeat={a.repeat}")
    print(f"{'what':<22}{'tokens/s':>14}{'per seq tok/s':>16}")
    for p in prefill:
        print(f"{'prefill ' + str(p['tokens']):<22}{p['tokens_per_s']:>14.1f}{'':>16}")
    for d in dec:
        print(f"{'decode batch ' + str(d['batch']):<22}{d['aggregate_tokens_per_s']:>14.1f}"
              f"{d['per_sequence_tokens_per_s']:>16.1f}")


if __name__ == "__main__":
    main()
