"""Writes all-MiniLM-L6-v2 as an ONNX graph for ONNX Runtime, from its safetensors weights.

    python3 scripts/export-encoder-onnx.py MODEL_DIR      # writes MODEL_DIR/model.onnx

The graph uses ONNX Runtime's fused transformer operators (com.microsoft domain:
EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu), which its CPU and
CUDA providers implement directly, so no exporter and no graph-fusion pass is needed. It
takes `input_ids` and `attention_mask` (int64, batch x tokens, right-padded) and returns
`last_hidden_state` (batch x tokens x hidden); the encoder pools in Rust, as it does for
candle. Needs numpy and onnx; the weights are read without the safetensors package.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CONTRIB = "com.microsoft"
DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = data[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        tensors[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(info["shape"])
    return tensors


def build(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        sys.exit("export-encoder-onnx: only BERT with gelu and absolute positions is supported")
    weights = read_safetensors(model_dir / "model.safetensors")
    eps = float(config["layer_norm_eps"])
    initializers, nodes = [], []

    def constant(name, array):
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, output, **attrs):
        domain = CONTRIB if op in ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu") else ""
        nodes.append(helper.make_node(op, inputs, [output] if isinstance(output, str) else output, name=f"{op}_{len(nodes)}", domain=domain, **attrs))
        return output

    ids = node("Cast", ["input_ids"], "ids_i32", to=TensorProto.INT32)
    mask = node("Cast", ["attention_mask"], "mask_i32", to=TensorProto.INT32)
    # Every token is segment 0, as in the sentence-transformers model.
    segments = node("Mul", [ids, constant("zero_i32", np.array(0, dtype=np.int32))], "segment_ids")
    e = "embeddings."
    node(
        "EmbedLayerNormalization",
        [
            ids,
            segments,
            constant("word_embeddings", weights[e + "word_embeddings.weight"]),
            constant("position_embeddings", weights[e + "position_embeddings.weight"]),
            constant("token_type_embeddings", weights[e + "token_type_embeddings.weight"]),
            constant("embeddings_ln_gamma", weights[e + "LayerNorm.weight"]),
            constant("embeddings_ln_beta", weights[e + "LayerNorm.bias"]),
            mask,
        ],
        ["hidden_0", "mask_index"],
        epsilon=eps,
    )
    hidden = "hidden_0"
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        a = p + "attention."
        # Attention takes one (hidden, 3 * hidden) projection: query, key and value side by side.
        qkv_weight = np.concatenate([weights[a + f"self.{m}.weight"].T for m in ("query", "key", "value")], axis=1)
        qkv_bias = np.concatenate([weights[a + f"self.{m}.bias"] for m in ("query", "key", "value")])
        context = node(
            "Attention",
            [hidden, constant(f"l{layer}_qkv_w", qkv_weight), constant(f"l{layer}_qkv_b", qkv_bias), "mask_index"],
            f"l{layer}_context",
            num_heads=config["num_attention_heads"],
        )
        projected = node("MatMul", [context, constant(f"l{layer}_attn_out_w", weights[a + "output.dense.weight"].T)], f"l{layer}_attn_out")
        attended = node(
            "SkipLayerNormalization",
            [
                projected,
                hidden,
                constant(f"l{layer}_attn_ln_gamma", weights[a + "output.LayerNorm.weight"]),
                constant(f"l{layer}_attn_ln_beta", weights[a + "output.LayerNorm.bias"]),
                constant(f"l{layer}_attn_out_b", weights[a + "output.dense.bias"]),
            ],
            f"l{layer}_attended",
            epsilon=eps,
        )
        up = node("MatMul", [attended, constant(f"l{layer}_ffn_up_w", weights[p + "intermediate.dense.weight"].T)], f"l{layer}_ffn_up")
        activated = node("BiasGelu", [up, constant(f"l{layer}_ffn_up_b", weights[p + "intermediate.dense.bias"])], f"l{layer}_ffn_gelu")
        down = node("MatMul", [activated, constant(f"l{layer}_ffn_down_w", weights[p + "output.dense.weight"].T)], f"l{layer}_ffn_down")
        hidden = node(
            "SkipLayerNormalization",
            [
                down,
                attended,
                constant(f"l{layer}_ffn_ln_gamma", weights[p + "output.LayerNorm.weight"]),
                constant(f"l{layer}_ffn_ln_beta", weights[p + "output.LayerNorm.bias"]),
                constant(f"l{layer}_ffn_down_b", weights[p + "output.dense.bias"]),
            ],
            f"hidden_{layer + 1}",
            epsilon=eps,
        )
    node("Identity", [hidden], "last_hidden_state")
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", config["hidden_size"]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)])
    model.producer_name = "hasten export-encoder-onnx"
    return model


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: export-encoder-onnx.py MODEL_DIR")
    model_dir = Path(sys.argv[1])
    model = build(model_dir)
    partial = model_dir / "model.onnx.partial"
    onnx.save(model, partial)
    partial.rename(model_dir / "model.onnx")
    print(f"wrote {model_dir / 'model.onnx'}", file=sys.stderr)


if __name__ == "__main__":
    main()
