"""Drives an edge's OpenAI-compatible API with the official OpenAI Python SDK, as an
application would, and prints what it saw as one JSON object (tests/tests/answers.rs checks it).

usage: openai_chat.py EDGE_HTTP_ADDR QUESTION
"""
import json
import sys

import openai
from openai import OpenAI

edge, question = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"http://{edge}/v1", api_key="not-needed-without-tenants", max_retries=0)
seen = {"sdk": openai.__version__}

seen["models"] = sorted(m.id for m in client.models.list())

messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
reply = client.chat.completions.create(model="hasten-rag", messages=messages, max_tokens=24)
seen["content"] = reply.choices[0].message.content
seen["finish_reason"] = reply.choices[0].finish_reason
seen["usage"] = reply.usage.model_dump()
seen["documents"] = len((reply.model_extra or {}).get("hasten", {}).get("documents", []))

pieces = []
# The same request streamed: the same prompt, so the same greedy answer.
for chunk in client.chat.completions.create(
    model="hasten-rag", messages=messages, max_tokens=24, stream=True
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
seen["streamed"] = "".join(pieces)
seen["stream_chunks"] = len(pieces)

speculative = client.chat.completions.create(
    model="hasten-rag-speculative",
    messages=[{"role": "user", "content": question}],
    max_tokens=32,
)
seen["speculative"] = speculative.choices[0].message.content

try:
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": question}])
    seen["unknown_model"] = "accepted"
except openai.NotFoundError as error:
    seen["unknown_model"] = {"status": error.status_code, "code": error.code, "param": error.param}

try:
    client.chat.completions.create(model="hasten-rag", messages=[{"role": "system", "content": "x"}])
    seen["no_user_message"] = "accepted"
except openai.BadRequestError as error:
    seen["no_user_message"] = {"status": error.status_code, "param": error.param}

print(json.dumps(seen))
