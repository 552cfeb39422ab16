"""Independent reference embedding for the encoder's golden-value test.

Produces all-MiniLM-L6-v2 sentence embeddings without candle and without the Rust
`tokenizers` crate: tokenisation by transformers' pure-Python `BertTokenizerLegacy`
(WordPiece written in Python), the BERT forward pass written here in numpy from the
safetensors weights, mean pooling over the attention mask and L2 normalisation, as
sentence-transformers defines the model (modules.json: Transformer, Pooling(mean), Normalize).

Run (needs `pip install numpy safetensors transformers`, no torch):
    python3 core/tests/golden/minilm_reference.py models/all-MiniLM-L6-v2 > core/tests/golden/minilm_golden.json
"""

import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

SENTENCES = [
    "Hasten answers most retrieval queries at the edge by speculating on homologous queries.",
]


def layer_norm(x, w, b, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu(x):
    # BERT's "gelu" is the exact erf form.
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def embed(model_dir, text):
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = {k: v.astype(np.float64) for k, v in load_file(f"{model_dir}/model.safetensors").items()}
    tok = BertTokenizerLegacy(vocab_file=f"{model_dir}/vocab.txt", do_lower_case=True)
    ids = tok(text, truncation=True, max_length=256)["input_ids"]
    n = len(ids)
    h = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    h = layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    heads = cfg["num_attention_heads"]
    dh = cfg["hidden_size"] // heads
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda x, name: x @ w[p + name + ".weight"].T + w[p + name + ".bias"]
        q = lin(h, "attention.self.query").reshape(n, heads, dh).transpose(1, 0, 2)
        k = lin(h, "attention.self.key").reshape(n, heads, dh).transpose(1, 0, 2)
        v = lin(h, "attention.self.value").reshape(n, heads, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, heads * dh)
        h = layer_norm(
            lin(ctx, "attention.output.dense") + h,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        inter = gelu(lin(h, "intermediate.dense"))
        h = layer_norm(
            lin(inter, "output.dense") + h,
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
        )
    pooled = h.mean(0)
    return ids, pooled / np.linalg.norm(pooled)


def main():
    model_dir = sys.argv[1]
    out = []
    for text in SENTENCES:
        ids, vec = embed(model_dir, text)
        out.append({"text": text, "token_ids": ids, "embedding": [round(float(x), 7) for x in vec]})
    json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2", "reference": "numpy + BertTokenizerLegacy", "sentences": out}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
