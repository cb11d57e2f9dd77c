"""Model shapes without weights, and random-weight models of those shapes.

``describe(gguf_path)`` keeps what a GGUF says besides its weights: every metadata field
(tokenizer included) with its GGUF value type, and each tensor's name and shape. ``save``
writes that as gzipped JSON (a few MB for Qwen2.5-Coder's vocabulary), small enough to carry
to a machine without network. ``scaled`` derives another shape of the same architecture
(the 7B from the 1.5B: other widths and depth, the same tokenizer), and ``tiny`` a small one
for a CPU (the same vocabulary, narrow layers), so the CPU mode runs the same pipeline.

``write_f16(shape, path)`` writes a GGUF of that shape whose weights are random F16 values
(norms are ones, so activations stay finite); llama.cpp's ``llama-quantize`` then makes the
quantized file from it, with the same per-tensor types a real Q4_K_M has. The model is made
decisive: its output matrix is its embedding and the branches that join the residual stream
are small, so it repeats its last token with a margin of several logits. Random weights
alone give near-equal top logits, which the rounding of one batch shape or another
reorders: an identical draft would then be rejected most of the time, and greedy choices
would hang on rounding. Weights are tiled from one random pool (the embedding, whose rows
must differ, is drawn whole) and written tensor by tensor: a 7B's 15 GB of F16 take seconds
of memory bandwidth, and never sit in memory together.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

POOL = 1 << 24  # random F16 values tiled into every weight but the embeddings
# The matrices whose outputs join the residual stream, made small: each token's hidden state
# stays its own embedding, so that (with the output matrix equal to the embedding) the model
# repeats its last token by a wide margin.
RESIDUAL = ("attn_output.weight", "ffn_down.weight")
RESIDUAL_SCALE = 1e-3
BLOCK = 256  # K-quant super-block: widths stay multiples of it


def describe(path: Path) -> dict[str, Any]:
    """Metadata fields (value, value type, array item type) and tensor shapes of a GGUF."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the header's own counts
        kinds = field.types
        sub = int(kinds[1]) if kinds[0] == GGUFValueType.ARRAY else None
        value = field.contents()
        fields[key] = [value, int(kinds[0]), sub]
    tensors = [[t.name, [int(n) for n in t.shape]] for t in reader.tensors]
    return {"fields": fields, "tensors": tensors}


def save(shape: dict[str, Any], path: Path) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(shape, fh)


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _arch(shape: dict[str, Any]) -> str:
    return shape["fields"]["general.architecture"][0]


def _dims(shape: dict[str, Any]) -> dict[str, int]:
    arch, f = _arch(shape), shape["fields"]
    return {
        "n_embd": f[f"{arch}.embedding_length"][0],
        "n_ff": f[f"{arch}.feed_forward_length"][0],
        "n_layer": f[f"{arch}.block_count"][0],
        "n_head": f[f"{arch}.attention.head_count"][0],
        "n_head_kv": f[f"{arch}.attention.head_count_kv"][0],
    }


def scaled(
    shape: dict[str, Any], name: str, *, n_embd: int, n_ff: int, n_layer: int, n_head: int,
    n_head_kv: int, tied: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The same architecture and tokenizer at other sizes: every tensor of a block
    rescaled by the widths it depends on (head dimension = n_embd / n_head); ``tied``:
    no separate output matrix (the token embedding serves)."""
    arch, old = _arch(shape), _dims(shape)
    head, old_head = n_embd // n_head, old["n_embd"] // old["n_head"]
    sizes = {
        old["n_embd"]: n_embd, old["n_ff"]: n_ff,
        old["n_head_kv"] * old_head: n_head_kv * head,
    }  # fmt: skip
    fields = dict(shape["fields"])
    for key, value in (
        ("embedding_length", n_embd), ("feed_forward_length", n_ff), ("block_count", n_layer),
        ("attention.head_count", n_head), ("attention.head_count_kv", n_head_kv),
    ):  # fmt: skip
        kind = fields[f"{arch}.{key}"]
        fields[f"{arch}.{key}"] = [value, kind[1], kind[2]]
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if f"{arch}.{key}" in fields:  # the head dimension, where the file states it
            fields[f"{arch}.{key}"] = [head, *fields[f"{arch}.{key}"][1:]]
    if "general.name" in fields:
        fields["general.name"] = [name, *fields["general.name"][1:]]
    n_vocab = len(fields["tokenizer.ggml.tokens"][0])
    tensors, block0 = [], [t for t in shape["tensors"] if t[0].startswith("blk.0.")]
    for tname, dims in shape["tensors"]:
        if tname.startswith("blk."):
            continue
        if tname == "output.weight" and tied:
            continue
        tensors.append([tname, [n_vocab if d == n_vocab else sizes.get(d, d) for d in dims]])
    if not tied and not any(t[0] == "output.weight" for t in tensors):
        tensors.append(["output.weight", [n_embd, n_vocab]])
    for layer in range(n_layer):
        for tname, dims in block0:
            tensors.append([f"blk.{layer}." + tname[6:], [sizes.get(d, d) for d in dims]])
    return {"fields": fields, "tensors": tensors}


def tiny(shape: dict[str, Any], name: str, n_layer: int = 2, n_embd: int = 256) -> dict:
    """A small model of ``shape``'s architecture and vocabulary, for a CPU."""
    return scaled(
        shape, name, n_embd=n_embd, n_ff=2 * n_embd, n_layer=n_layer, n_head=4, n_head_kv=2
    )


def parameters(shape: dict[str, Any]) -> int:
    return sum(int(np.prod(dims)) for _, dims in shape["tensors"])


def write_f16(shape: dict[str, Any], path: Path, seed: int = 0) -> Path:
    """A GGUF of ``shape`` with random F16 weights (F32 ones for 1-D tensors)."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    writer = GGUFWriter(path, _arch(shape))
    for key, (value, kind, sub) in shape["fields"].items():
        if key in ("general.architecture", "general.file_type"):
            continue
        writer.add_key_value(
            key, value, GGUFValueType(kind), GGUFValueType(sub) if sub is not None else None
        )
    writer.add_file_type(1)  # all F16
    for name, dims in shape["tensors"]:
        one_d = len(dims) == 1
        dtype = np.float32 if one_d else np.float16
        n = int(np.prod(dims))
        raw = GGMLQuantizationType.F32 if one_d else GGMLQuantizationType.F16
        writer.add_tensor_info(name, list(reversed(dims)), np.dtype(dtype), n * dtype().nbytes, raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL) * 0.02).astype(np.float16)
    # Scaled once here: numpy's float16 arithmetic is slow, tensor by tensor it took minutes.
    residual_pool = (pool.astype(np.float32) * RESIDUAL_SCALE).astype(np.float16)
    embedding = None  # token_embd's values, output's too
    offset = 0
    for name, dims in shape["tensors"]:
        n = int(np.prod(dims))
        if len(dims) == 1:  # norms and biases: ones and zeros keep activations finite
            fill = np.ones if name.endswith("norm.weight") else np.zeros
            data = fill(n, np.float32)
        elif name in ("token_embd.weight", "output.weight"):
            if embedding is None or embedding.size != n:
                embedding = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16)
            data = embedding
        else:
            source = residual_pool if name.endswith(RESIDUAL) else pool
            data = np.resize(np.roll(source, -(offset % POOL)), n)
            offset += 7919  # another start for every tensor
        writer.write_tensor_data(data)
    writer.close()
    return path
