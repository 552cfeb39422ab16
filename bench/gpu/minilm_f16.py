"""Writes all-MiniLM-L6-v2 with its float32 weights stored as float16 (45 MB instead of 87), so
that it fits the device tool's 64 MiB carry; candle widens them back to float32 on load.

    python3 bench/gpu/minilm_f16.py MODEL_DIR OUT_DIR
"""

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

FILES = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
]


def main(src: Path, dst: Path) -> None:
    raw = (src / "model.safetensors").read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    base = 8 + header_len
    out_header, blobs, offset = {}, [], 0
    for name, meta in header.items():
        if name == "__metadata__":
            out_header[name] = meta
            continue
        start, end = meta["data_offsets"]
        data, dtype = raw[base + start : base + end], meta["dtype"]
        if dtype == "F32":
            data, dtype = np.frombuffer(data, dtype="<f4").astype("<f2").tobytes(), "F16"
        out_header[name] = {
            "dtype": dtype,
            "shape": meta["shape"],
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(out_header).encode()
    encoded += b" " * ((8 - len(encoded) % 8) % 8)
    dst.mkdir(parents=True, exist_ok=True)
    with open(dst / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
    for name in FILES:
        shutil.copy(src / name, dst / name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
