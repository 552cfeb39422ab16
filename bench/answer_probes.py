"""The answer surface probed as a new user would, with the OpenAI SDK against running edges
(bench/answer-probes.sh starts them). Prints one JSON object:

- conversation: "Who won Super Bowl 50?", then "Who did they beat?": the answers and the
  query the follow-up was retrieved with;
- stuff_prompt: a LangChain-style "stuff" prompt (retrieved context in the user message,
  4,482 characters): the status and the answer;
- abandoned_streams: one honest streamed answer timed alone, then again after N streams
  that ask for long answers were dropped after their first line;
- burst: M concurrent streamed requests against an edge with the default queue: how many got
  a normal stream, a 429, or a 200 followed by an error inside the stream;
- back_to_back: sequential requests (each sent after the previous reply arrived) against an
  edge with answer_queue = 1: how many were refused.

usage: answer_probes.py EDGE EDGE_WITH_QUEUE_1 QUESTIONS_JSONL [--abandoned N] [--burst M]
"""
import argparse
import json
import threading
import time

import httpx
import openai

parser = argparse.ArgumentParser()
parser.add_argument("edge")
parser.add_argument("edge_queue_1")
parser.add_argument("questions")
parser.add_argument("--abandoned", type=int, default=12)
parser.add_argument("--burst", type=int, default=20)
parser.add_argument("--back-to-back", type=int, default=10)
args = parser.parse_args()

questions = [json.loads(line)["question"] for line in open(args.questions)]
MODEL = "hasten-rag"


def client(edge):
    return openai.OpenAI(base_url=f"http://{edge}/v1", api_key="unused", max_retries=0, timeout=600)


def stuff_prompt():
    context = " ".join(questions[1:400])[:4400]
    content = f"Use the context to answer.\n\nContext:\n{context}\n\nQuestion: {questions[0]}"
    content = content[:4482 - len(questions[0])] if len(content) > 4482 else content
    try:
        reply = client(args.edge).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=24
        )
        return {"chars": len(content), "status": 200, "answer": reply.choices[0].message.content}
    except openai.APIStatusError as error:
        return {"chars": len(content), "status": error.status_code, "error": str(error)[:200]}


def conversation():
    """The issue's follow-up: the second question only makes sense with the first."""
    c = client(args.edge)
    messages = [{"role": "user", "content": "Who won Super Bowl 50?"}]
    first = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Who did they beat?"}]
    second = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    extra = second.model_extra or {}
    return {"first": first.choices[0].message.content,
            "second": second.choices[0].message.content,
            "second_query": extra.get("hasten", {}).get("query")}


def honest_answer_seconds():
    started = time.monotonic()
    for _ in client(args.edge).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": questions[0]}], max_tokens=32, stream=True
    ):
        pass
    return time.monotonic() - started


def cancelled_count():
    """The edge's hasten_answer_cancelled_total (0 on an edge that has none)."""
    for line in httpx.get(f"http://{args.edge}/metrics", timeout=10).text.splitlines():
        if line.startswith("hasten_answer_cancelled_total "):
            return int(float(line.split()[1]))
    return 0


def abandoned_streams():
    honest_answer_seconds()  # warm the caches
    alone = honest_answer_seconds()
    cancelled_before = cancelled_count()
    started = time.monotonic()
    for i in range(args.abandoned):
        body = {"model": MODEL, "max_tokens": 256, "stream": True,
                "messages": [{"role": "user", "content": questions[1 + i]}]}
        with httpx.stream("POST", f"http://{args.edge}/v1/chat/completions", json=body, timeout=600) as r:
            next(r.iter_lines())
    dropping = time.monotonic() - started
    time.sleep(0.5)
    cancelled_at_once = cancelled_count() - cancelled_before
    after = honest_answer_seconds()
    return {"abandoned": args.abandoned, "client_effort_s": round(dropping, 2),
            "cancelled_within_half_a_second": cancelled_at_once,
            "cancelled_in_all": cancelled_count() - cancelled_before,
            "honest_alone_s": round(alone, 2), "honest_after_s": round(after, 2),
            "ratio": round(after / alone, 2)}


def burst():
    outcomes = []

    def one(i):
        body = {"model": MODEL, "max_tokens": 32, "stream": True,
                "messages": [{"role": "user", "content": questions[i]}]}
        try:
            with httpx.stream("POST", f"http://{args.edge}/v1/chat/completions", json=body, timeout=600) as r:
                if r.status_code != 200:
                    r.read()
                    outcomes.append((r.status_code, r.headers.get("retry-after"), False))
                    return
                lines = list(r.iter_lines())
                errored = any('"error"' in line for line in lines)
                outcomes.append((200, None, errored))
        except httpx.HTTPError as error:
            outcomes.append((0, str(error), False))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.burst)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "requests": args.burst,
        "streamed": sum(1 for s, _, e in outcomes if s == 200 and not e),
        "ok_then_error": sum(1 for s, _, e in outcomes if s == 200 and e),
        "refused_429": sum(1 for s, _, _ in outcomes if s == 429),
        "refused_with_retry_after": sum(1 for s, r, _ in outcomes if s == 429 and r),
        "other": [s for s, _, _ in outcomes if s not in (200, 429)],
    }


def back_to_back():
    refused = 0
    for i in range(args.back_to_back):
        pieces = []
        try:
            for chunk in client(args.edge_queue_1).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": questions[i]}], max_tokens=24,
                stream=True,
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                    if len("".join(pieces).split()) >= 3:
                        # An application that has what it needs stops reading the stream.
                        break
        except openai.RateLimitError:
            refused += 1
    return {"requests": args.back_to_back, "refused_429": refused}


print(json.dumps({
    "conversation": conversation(),
    "stuff_prompt": stuff_prompt(),
    "abandoned_streams": abandoned_streams(),
    "burst": burst(),
    "back_to_back": back_to_back(),
}, indent=1))
