"""Drives an edge's chat API with the clients RAG applications use, as they use them: the
OpenAI Python SDK, LangChain's ChatOpenAI and LlamaIndex's OpenAILike, each both whole and
streamed. Prints what it saw as one JSON object (tests/tests/chat_clients.rs checks it).

usage: chat_clients.py EDGE_HTTP_ADDR QUESTION FOLLOW_UP
"""
import json
import sys

import openai
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

edge, question, follow_up = sys.argv[1], sys.argv[2], sys.argv[3]
base_url = f"http://{edge}/v1"
MODEL = "hasten-rag"
MAX_TOKENS = 16
K = 3
SYSTEM = "You are a careful assistant. Answer in as few words as possible."
# An application's own "stuff" prompt: its context first, then the question (~8,000 characters).
LONG = ("Background notes, not all of them relevant. " * 180)[:7900] + "\nQuestion: " + question


def conversation(kind):
    """The probes' messages as (role, content) pairs."""
    if kind == "system":
        return [("system", SYSTEM), ("user", question)]
    if kind == "history":
        return [("user", question), ("assistant", "I am not sure."), ("user", follow_up)]
    if kind == "long":
        return [("user", LONG)]
    return [("user", question)]


class OpenAIClient:
    def __init__(self):
        self.client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    def ask(self, kind, stream, stop=None, temperature=0.0, seed=None):
        args = dict(
            model=MODEL,
            messages=[{"role": r, "content": c} for r, c in conversation(kind)],
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            extra_body={"k": K},
        )
        if stop is not None:
            args["stop"] = stop
        if seed is not None:
            args["seed"] = seed
        if not stream:
            reply = self.client.chat.completions.create(**args)
            extra = reply.model_extra or {}
            return {
                "content": reply.choices[0].message.content,
                "finish_reason": reply.choices[0].finish_reason,
                "prompt_tokens": reply.usage.prompt_tokens,
                "hasten_prompt_tokens": extra.get("hasten", {}).get("prompt_tokens"),
                "query": extra.get("hasten", {}).get("query"),
            }
        pieces, finish, usage = [], None, None
        for chunk in self.client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        ):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return {
            "content": "".join(pieces),
            "finish_reason": finish,
            "prompt_tokens": usage.prompt_tokens if usage else None,
        }


class LangChainClient:
    ROLES = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}

    def model(self, temperature, seed):
        return ChatOpenAI(
            model=MODEL,
            base_url=base_url,
            api_key="unused",
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            seed=seed,
            max_retries=0,
            stream_usage=True,
            extra_body={"k": K},
        )

    def ask(self, kind, stream, stop=None, temperature=0.0, seed=None):
        model = self.model(temperature, seed)
        messages = [self.ROLES[r](content=c) for r, c in conversation(kind)]
        if not stream:
            reply = model.invoke(messages, stop=stop)
            usage = reply.usage_metadata or {}
            return {
                "content": reply.content,
                "finish_reason": reply.response_metadata.get("finish_reason"),
                "prompt_tokens": usage.get("input_tokens"),
            }
        whole = None
        for chunk in model.stream(messages, stop=stop):
            whole = chunk if whole is None else whole + chunk
        usage = whole.usage_metadata or {}
        return {
            "content": whole.content,
            "finish_reason": whole.response_metadata.get("finish_reason"),
            "prompt_tokens": usage.get("input_tokens"),
        }


class LlamaIndexClient:
    def model(self, temperature, seed, stop):
        extra = {"extra_body": {"k": K}}
        if seed is not None:
            extra["seed"] = seed
        if stop is not None:
            extra["stop"] = stop
        return OpenAILike(
            model=MODEL,
            api_base=base_url,
            api_key="unused",
            is_chat_model=True,
            context_window=8192,
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            max_retries=0,
            additional_kwargs=extra,
        )

    def ask(self, kind, stream, stop=None, temperature=0.0, seed=None):
        model = self.model(temperature, seed, stop)
        messages = [ChatMessage(role=r, content=c) for r, c in conversation(kind)]
        if not stream:
            reply = model.chat(messages)
            raw = reply.raw
            usage = getattr(raw, "usage", None)
            return {
                "content": reply.message.content,
                "finish_reason": raw.choices[0].finish_reason if raw is not None else None,
                "prompt_tokens": usage.prompt_tokens if usage else None,
            }
        last = None
        for last in model.stream_chat(messages):
            pass
        return {"content": last.message.content if last else "", "finish_reason": None,
                "prompt_tokens": None}


def probe(client, stream):
    seen = {kind: client.ask(kind, stream) for kind in ("plain", "system", "history", "long")}
    words = seen["plain"]["content"].split()
    # A stop string taken from the greedy answer: the answer must end just before it.
    stop = words[1] if len(words) > 1 else None
    seen["stop_string"] = stop
    if stop is not None:
        seen["stopped"] = client.ask("plain", stream, stop=[stop])
    seen["seeded"] = [
        client.ask("plain", stream, temperature=1.0, seed=7)["content"] for _ in range(2)
    ]
    return seen


def embeddings():
    """The edge's encoder through the OpenAI SDK (base64 vectors, its default) and
    LangChain's OpenAIEmbeddings (which must not tokenise for OpenAI's models)."""
    texts = [question, f"Please tell me: {question}", "A recipe for fresh pasta with eggs and flour."]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    sdk = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    langchain = OpenAIEmbeddings(
        model="all-MiniLM-L6-v2",
        base_url=base_url,
        api_key="unused",
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    return {
        "models": sorted(m.id for m in client.models.list()),
        "sdk": [list(d.embedding) for d in sdk.data],
        "usage": sdk.usage.prompt_tokens,
        "langchain": langchain.embed_documents(texts),
        "langchain_query": langchain.embed_query(question),
    }


clients = {"openai": OpenAIClient(), "langchain": LangChainClient(), "llamaindex": LlamaIndexClient()}
report = {
    "versions": {"openai": openai.__version__},
    "embeddings": embeddings(),
    "clients": {
        name: {"invoke": probe(client, False), "stream": probe(client, True)}
        for name, client in clients.items()
    },
}
print(json.dumps(report))
