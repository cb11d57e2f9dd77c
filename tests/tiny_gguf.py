"""Tiny, loadable llama-architecture GGUF models for tests.

``write_tiny_llama(path, ...)`` writes a real model that llama.cpp loads, tokenizes and
evaluates in milliseconds: random weights (seeded), a SentencePiece-style ("llama")
tokenizer with byte fallback, so any UTF-8 text tokenizes.

Vocabulary contract:

- ids 0, 1, 2 are ``<unk>``, ``<s>`` (BOS), ``</s>`` (EOS); ids 3..258 are the 256 byte
  tokens ``<0x00>``..``<0xFF>``; then ``▁`` (space) and the printable ASCII characters; then
  the extra ``vocab`` pieces (spaces written as ``▁``) and every prefix of each, so the SPM
  merges can reach them; then the ``fim`` control tokens, if any (none by default); then
  ``<pad_N>`` fillers up to ``n_vocab``.
- The vocabulary depends only on ``vocab``, ``fim`` and ``n_vocab``, never on ``seed``: two
  models written with different seeds share it (a compatible target/draft pair); a
  different ``vocab`` or ``n_vocab`` gives an incompatible one.
- ``fim`` is the texts of the fill-in-the-middle tokens in llama.cpp's order: prefix, suffix,
  middle, pad, repo, file separator. llama.cpp finds known texts (``QWEN_FIM``) by
  themselves; ``fim_keys`` also writes their ids under ``tokenizer.ggml.fim_*_token_id``,
  which is how a model with other texts names them.
- Same arguments give byte-identical files, so the same seed twice is a draft that always
  agrees with its target.

Weights are scaled so logits are well spread (no near-ties that would make greedy output
depend on batch size). Dimensions default to multiples of 32 so the model can be
requantized to Q4_0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

F32 = "f32"
F16 = "f16"

_SPACE = "\u2581"  # SentencePiece's visible space
_CONTROL = ["<unk>", "<s>", "</s>"]
QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
            "<|file_sep|>")  # fmt: skip
_FIM_KEYS = ("pre", "suf", "mid", "pad", "rep", "sep")
DEFAULT_PIECES = ["▁the", "▁a", "▁and", "▁to", "▁of", "▁def", "▁return", "ing", "er", "in"]


def tiny_vocab(
    vocab: list[str] | None = None, n_vocab: int | None = None, fim: Sequence[str] = ()
) -> list[str]:
    """The token texts ``write_tiny_llama`` would write for these arguments, in id order."""
    pieces = DEFAULT_PIECES if vocab is None else vocab
    tokens = list(_CONTROL) + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [_SPACE] + [chr(c) for c in range(0x21, 0x7F)]
    seen = set(tokens)
    for piece in pieces:
        piece = piece.replace(" ", _SPACE)
        for end in range(2, len(piece) + 1):
            if piece[:end] not in seen:
                seen.add(piece[:end])
                tokens.append(piece[:end])
    if len(fim) not in (0, len(_FIM_KEYS)) or seen.intersection(fim):
        raise ValueError(f"fim needs {len(_FIM_KEYS)} new token texts, not {list(fim)}")
    tokens += fim
    if n_vocab is not None:
        if n_vocab < len(tokens):
            raise ValueError(f"n_vocab={n_vocab} is below the {len(tokens)} tokens needed")
        tokens += [f"<pad_{i}>" for i in range(n_vocab - len(tokens))]
    return tokens


def _token_types(tokens: list[str], control: Sequence[str] = ()) -> list[int]:
    types = []
    for i, tok in enumerate(tokens):
        if tok in control:
            types.append(gguf.TokenType.CONTROL)
        elif i < len(_CONTROL):
            types.append(gguf.TokenType.CONTROL if i else gguf.TokenType.UNKNOWN)
        elif i < len(_CONTROL) + 256:
            types.append(gguf.TokenType.BYTE)
        elif tok.startswith("<pad_"):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    return [int(t) for t in types]


def write_tiny_llama(
    path: str | Path,
    *,
    vocab: list[str] | None = None,
    n_vocab: int | None = None,
    seed: int = 0,
    ftype: str = F32,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
    chat_template: str | None = None,
    add_bos: bool = True,
    prefer_text: bool = True,
    name: str = "tiny-llama",
    fim: Sequence[str] = (),
    fim_keys: bool = False,
) -> Path:
    """Write a tiny llama GGUF to ``path`` and return it.

    ``ftype`` is ``F32`` or ``F16`` (2-D weights only; norms stay F32, as llama.cpp's
    converters write them). ``prefer_text`` makes control and byte tokens unlikely, so
    greedy output is readable text that rarely hits EOS; turn it off to exercise them.
    ``fim`` adds fill-in-the-middle control tokens (see the module's vocabulary contract).
    """
    if ftype not in (F32, F16):
        raise ValueError(f"ftype must be {F32!r} or {F16!r}, not {ftype!r}")
    path = Path(path)
    tokens = tiny_vocab(vocab, n_vocab, fim)
    types = _token_types(tokens, fim)
    # Longer pieces score higher, so merges prefer whole words.
    scores = [0.0 if i < 259 else float(len(t)) for i, t in enumerate(tokens)]
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    wdtype = np.float32 if ftype == F32 else np.float16

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy shape (rows, cols) is ggml ne = [cols, rows]: cols is the input dimension.
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(wdtype)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == F32 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    if fim_keys:
        for key, text in zip(_FIM_KEYS, fim, strict=True):
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", tokens.index(text))
    if chat_template is not None:
        w.add_chat_template(chat_template)

    # Unit-variance embeddings and an untied output head give logits of order 1.
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n_embd)).astype(wdtype))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    head = mat(len(tokens), n_embd).astype(np.float32) * 4
    if prefer_text:
        # Damp control, byte and filler rows so generated text is mostly printable pieces.
        head[[i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]] *= 0.1
    w.add_tensor("output.weight", head.astype(wdtype))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
