#!/usr/bin/env python3
"""Find where a target's logits stop being batch-invariant, operation by operation.

    python experiments/exactness_probe.py MODEL.gguf [--setting default|norepack|notiled|exact]
        [--context 600] [--batch 2 3 8 16 33 64] [--threads N]

For each batch size k it evaluates k tokens after a context twice: one at a time, and as one
batch. Through llama.cpp's eval callback (``cb_eval``) it keeps every float intermediate
tensor of the last token's row, then prints the first tensor (in graph order) whose row
differs between the two runs, with its operation and its inputs' types, and the largest
difference of the final logits. One JSON line per batch size goes to stdout.

Settings (``GGML_CPU_TILED_MM`` is read once per process, so each setting is its own run):
  default   weight repacking on, f16 cache, tiled matmul on (llama.cpp's defaults)
  norepack  ``use_extra_bufts`` off
  notiled   repacking off and ``GGML_CPU_TILED_MM=0``
  exact     as notiled, with a bf16 cache: localspec's ``--exact``
Flash attention is on in every setting, as localspec loads its models.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 = 0, 1, 30


class GgmlTensor(ctypes.Structure):  # ggml.h's struct ggml_tensor (GGML_MAX_* defaults)
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    settings = ["default", "norepack", "notiled", "exact"]
    ap.add_argument("--setting", default="default", choices=settings)
    ap.add_argument("--context", type=int, default=600, help="tokens before the probed ones")
    ap.add_argument("--batch", type=int, nargs="+", default=[2, 3, 8, 16, 33, 64])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.setting in ("notiled", "exact"):
        os.environ["GGML_CPU_TILED_MM"] = "0"  # before llama.cpp's first matmul

    import llama_cpp
    import numpy as np

    libdir = Path(llama_cpp.__file__).parent / "lib"
    ggml = ctypes.CDLL(str(next(libdir.glob("libggml-base.so*"))))
    ggml.ggml_op_desc.restype = ctypes.c_char_p
    ggml.ggml_op_desc.argtypes = [ctypes.c_void_p]
    ggml.ggml_type_name.restype = ctypes.c_char_p
    ggml.ggml_type_name.argtypes = [ctypes.c_int]
    ggml.ggml_backend_buffer_name.restype = ctypes.c_char_p
    ggml.ggml_backend_buffer_name.argtypes = [ctypes.c_void_p]

    quiet = llama_cpp.llama_log_callback(lambda *a: None)  # kept alive while llama.cpp logs
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = args.setting == "default"
    model = llama_cpp.llama_model_load_from_file(str(args.model).encode(), mparams)
    if not model:
        print(f"error: cannot load {args.model}", file=sys.stderr)
        return 1
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    captured: list[tuple[str, int, str, np.ndarray]] = []
    capture = {"on": False, "rows": 1}

    def on_tensor(ptr: int, ask: bool, _user: ctypes.c_void_p) -> bool:
        if ask:
            return capture["on"]
        t = GgmlTensor.from_address(ptr)
        if t.type != GGML_TYPE_F32 or not t.data:
            return True
        ne, nb = list(t.ne), list(t.nb)
        view = np.lib.stride_tricks.as_strided(
            np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), (1,)),
            shape=ne[::-1],
            strides=nb[::-1],
        )
        srcs = [GgmlTensor.from_address(s) for s in t.src if s]
        # The weights' buffer names the kernel family: CPU_REPACK holds repacked weights.
        types = [ggml.ggml_type_name(s.type).decode() for s in srcs]
        if srcs and srcs[0].buffer:
            types[0] += "@" + ggml.ggml_backend_buffer_name(srcs[0].buffer).decode()
        op = f"{ggml.ggml_op_desc(ptr).decode()}({','.join(types)})"
        captured.append((t.name.decode(), ptr, op, view.copy()))
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = args.context + max(args.batch) + 8
    cparams.n_batch = cparams.n_ubatch = max(512, max(args.batch))
    cparams.n_threads = cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if args.setting == "exact":
        cparams.type_k = cparams.type_v = GGML_TYPE_BF16
    cparams.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    memory = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(cparams.n_batch, 0, 1)

    def decode(tokens: list[int], pos: int) -> np.ndarray:
        batch.n_tokens = len(tokens)
        for j, tok in enumerate(tokens):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, pos + j, 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = j == len(tokens) - 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), (n_vocab,)).copy()

    def last_rows(n_tokens: int) -> list[tuple[str, str, np.ndarray]]:
        """Each captured tensor cut to the last token (its token axis has n_tokens)."""
        out = []
        for name, _ptr, op, arr in captured:
            axis = next((i for i, n in enumerate(arr.shape) if n == n_tokens), None)
            if n_tokens > 1 and axis is None:
                continue
            out.append((name, op, arr.take([n_tokens - 1], axis=axis) if n_tokens > 1 else arr))
        return out

    text = (Path(__file__).resolve().parent.parent / "localspec" / "core" / "engine.py").read_text()
    buf = (llama_cpp.llama_token * (len(text) + 16))()
    data = text.encode()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), True, False)
    tokens = list(buf[:n])
    context, probe = tokens[: args.context], tokens[args.context : args.context + max(args.batch)]
    for off in range(0, len(context), cparams.n_batch):  # the context itself is not probed
        decode(context[off : off + cparams.n_batch], off)
    for k in args.batch:
        llama_cpp.llama_memory_seq_rm(memory, 0, len(context), -1)
        for j in range(k - 1):
            decode([probe[j]], len(context) + j)  # the rows before the probed one, alone
        captured.clear()
        capture["on"] = True
        alone_logits = decode([probe[k - 1]], len(context) + k - 1)
        alone = last_rows(1)
        llama_cpp.llama_memory_seq_rm(memory, 0, len(context), -1)
        captured.clear()
        batch_logits = decode(probe[:k], len(context))
        batched = last_rows(k)
        capture["on"] = False
        first = None
        for (name, op, a), (name_b, _op_b, b) in zip(alone, batched, strict=False):
            if name != name_b or a.size != b.size:
                continue
            if not np.array_equal(a.reshape(-1), b.reshape(-1)):
                gap = float(np.max(np.abs(a.reshape(-1) - b.reshape(-1))))
                first = {"tensor": name, "op": op, "max_diff": gap}
                break
        print(json.dumps({
            "setting": args.setting, "batch": k, "context": len(context),
            "logits_max_diff": float(np.max(np.abs(alone_logits - batch_logits))),
            "first_difference": first, "tensors_compared": min(len(alone), len(batched)),
        }), flush=True)  # fmt: skip
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
