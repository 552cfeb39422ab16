#!/usr/bin/env python3
"""Answers the same questions through several edges, one after another, and scores them:
exact match, F1 and containment against the gold answers (SQuAD v1.1's normalisation, the
definition hasten_rag::eval implements), and each answer's latency as its client sees it
(time to the first text and to the end of the stream).

usage: answer_eval.py --edge NAME=HOST:PORT [--edge ...] --questions FILE [--limit 100]
                      [--k 5] [--max-tokens 32] --out REPORT.json

Questions are JSON lines with `question` and `answers`; `--limit` takes them evenly spread
over the file. Each question goes to every edge before the next question (interleaved, so a
slow patch of the machine hits every system alike). Streaming chat completions, greedy.
"""
import argparse
import json
import re
import statistics
import string
import sys
import time
import urllib.request
from collections import Counter


def normalize(text):
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1(prediction, gold):
    predicted, expected = normalize(prediction).split(), normalize(gold).split()
    common = Counter(predicted) & Counter(expected)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(expected)
    return 2 * precision * recall / (precision + recall)


def score(prediction, answers):
    return {
        "em": max(float(normalize(prediction) == normalize(a)) for a in answers),
        "f1": max(f1(prediction, a) for a in answers),
        "contains": max(float(normalize(a) in normalize(prediction)) for a in answers),
    }


def ask(edge, question, k, max_tokens):
    body = json.dumps({
        "model": "hasten-rag",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "k": k,
    }).encode()
    request = urllib.request.Request(
        f"http://{edge}/v1/chat/completions", data=body,
        headers={"content-type": "application/json"})
    started = time.perf_counter()
    first = None
    text, usage = [], None
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    if first is None:
                        first = time.perf_counter() - started
                    text.append(delta)
    total = time.perf_counter() - started
    return "".join(text).strip(), first if first is not None else total, total, usage


def summary(rows):
    latencies = sorted(r["seconds"] for r in rows)
    return {
        "questions": len(rows),
        "em": statistics.mean(r["em"] for r in rows),
        "f1": statistics.mean(r["f1"] for r in rows),
        "contains": statistics.mean(r["contains"] for r in rows),
        "mean_s": statistics.mean(latencies),
        "p50_s": latencies[len(latencies) // 2],
        "p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "mean_first_text_s": statistics.mean(r["first_text_s"] for r in rows),
        "mean_prompt_tokens": statistics.mean((r["usage"] or {}).get("prompt_tokens", 0) for r in rows),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edge", action="append", required=True, help="NAME=HOST:PORT")
    parser.add_argument("--questions", required=True)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    edges = [tuple(e.split("=", 1)) for e in args.edge]
    with open(args.questions) as f:
        questions = [json.loads(line) for line in f if line.strip()]
    step = max(1, len(questions) // args.limit)
    questions = questions[::step][: args.limit]
    rows = {name: [] for name, _ in edges}
    for i, q in enumerate(questions, 1):
        for name, addr in edges:
            answer, first, total, usage = ask(addr, q["question"], args.k, args.max_tokens)
            rows[name].append({"question": q["question"], "answer": answer, "gold": q["answers"],
                               "first_text_s": first, "seconds": total, "usage": usage,
                               **score(answer, q["answers"])})
        if i % 10 == 0 or i == len(questions):
            done = ", ".join(f"{n} F1 {statistics.mean(r['f1'] for r in rows[n]):.3f}" for n, _ in edges)
            print(f"{i}/{len(questions)} questions: {done}", file=sys.stderr, flush=True)
    report = {"k": args.k, "max_tokens": args.max_tokens, "questions_file": args.questions,
              "systems": {name: summary(r) for name, r in rows.items()}, "answers": rows}
    names = [n for n, _ in edges]
    if len(names) >= 2:
        base = rows[names[0]]
        for name in names[1:]:
            same = sum(a["answer"] == b["answer"] for a, b in zip(base, rows[name]))
            report["systems"][name]["same_answer_as_" + names[0]] = same / len(base)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'system':<14} {'EM':>6} {'F1':>6} {'cont':>6} {'mean s':>7} {'p50 s':>6} {'p95 s':>6} {'first s':>7} {'prompt tok':>10}")
    for name, s in report["systems"].items():
        print(f"{name:<14} {s['em']:6.3f} {s['f1']:6.3f} {s['contains']:6.3f} {s['mean_s']:7.2f} "
              f"{s['p50_s']:6.2f} {s['p95_s']:6.2f} {s['mean_first_text_s']:7.2f} {s['mean_prompt_tokens']:10.0f}")


if __name__ == "__main__":
    main()
