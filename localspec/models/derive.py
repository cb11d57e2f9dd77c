"""A GGUF made of some of another GGUF's blocks: the file a self-speculative draft loads.

llama.cpp cannot skip layers at run time, and its loader refuses a file whose tensors do not
match its block count, so a target with layers left out has to be a file of its own.

Contract:

- ``derive_gguf(source, layers, dest)`` writes ``dest``: the blocks ``layers`` of ``source``
  (``blk.N.*`` tensors, N in ``layers``), renumbered 0..n-1 in order, and every tensor that
  belongs to no block (embeddings, output norm and head, rope factors...). Tensors are copied
  raw: their type and bytes are unchanged. Every metadata key is copied unchanged (so the
  tokenizer is the source's), except ``{arch}.block_count``, every ``{arch}.*`` array with one
  entry per block (cut to the kept blocks) and ``general.name`` (a suffix says which layers).
- ``layers`` must be non-empty, strictly increasing and within the block count, else
  ``UsageError``. A source that is not a readable GGUF, has no block count or more blocks
  than llama.cpp loads (``LLAMA_MAX_LAYERS``), is a ``ModelFileError``; a layer number past
  that limit is a ``UsageError`` before any list of layers is built.
- ``dest`` appears complete or not at all: the file is written under a temporary name in
  its directory and renamed on success; a failure removes it. A disk without room for it
  is a ``DownloadError`` (``resources.check_disk``) before anything is written, and one
  that fills up while it is written too.
- ``compact_layers`` and ``parse_layers`` turn a layer list into ``0-7,20-27`` and back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from localspec.errors import DownloadError, ModelFileError, UsageError
from localspec.models.gguf import check_gguf
from localspec.models.resources import check_disk, human
from localspec.models.transfer import is_disk_full
from localspec.statefiles import replacing

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
LLAMA_MAX_LAYERS = 512  # llama.cpp's limit (src/llama-hparams.h): it asserts past it
_NAME = "general.name"
_ARCH = "general.architecture"


def compact_layers(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3,7,9-10"`` (runs of consecutive layers)."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_layers(text: str) -> list[int]:
    """``"0-7,20-27"`` -> sorted unique layer numbers; ``UsageError`` on anything else."""
    hint = "give layer numbers and ranges from 0, e.g. --layers 0-7,20-27"
    layers: set[int] = set()
    for part in text.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise UsageError(f"invalid layer list {text!r}: {part!r} is not N or N-M", hint)
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first:
            raise UsageError(f"invalid layer list {text!r}: {part!r} runs backwards", hint)
        if last >= LLAMA_MAX_LAYERS:  # checked before the range is built
            raise UsageError(
                f"invalid layer list {text!r}: layer {last} is past llama.cpp's limit of "
                f"{LLAMA_MAX_LAYERS} layers",
                hint,
            )
        layers.update(range(first, last + 1))
    return sorted(layers)


def check_layers(layers: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """``layers`` as a tuple if it is a valid choice of blocks out of ``n_layers``."""
    kept = tuple(int(i) for i in layers)
    hint = f"choose increasing layer numbers from 0 to {n_layers - 1}, e.g. 0-7,20-27"
    if not kept:
        raise UsageError("a derived draft needs at least one layer", hint)
    if any(b <= a for a, b in zip(kept, kept[1:], strict=False)):
        raise UsageError(f"layers {list(kept)} are not increasing and unique", hint)
    if kept[0] < 0 or kept[-1] >= n_layers:
        raise UsageError(f"layers {compact_layers(kept)} are outside 0-{n_layers - 1}", hint)
    return kept


@dataclass
class Source:
    """A parsed source GGUF, reusable for several derivations (parsing a large vocabulary
    takes seconds)."""

    path: Path
    reader: gguf.GGUFReader
    arch: str
    n_layers: int


def open_source(path: Path) -> Source:
    path = check_gguf(Path(path))
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as err:  # any parse failure means a damaged or foreign file
        raise ModelFileError(
            f"cannot read the GGUF file {path}: {err}", "check the file, or download it again"
        ) from None
    arch_field = reader.get_field(_ARCH)
    arch = str(arch_field.contents()) if arch_field is not None else ""
    count = reader.get_field(f"{arch}.block_count") if arch else None
    if count is None:
        raise ModelFileError(
            f"{path} has no {arch or 'architecture'}.block_count: not a layered model",
            "a self-draft needs a transformer model with blocks of layers",
        )
    return Source(path, reader, arch, checked_block_count(path, count.contents()))


def checked_block_count(path: Path, count: object) -> int:
    """A header's block count, if llama.cpp could load a model of that many blocks;
    ``ModelFileError`` otherwise (a damaged or crafted header)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= LLAMA_MAX_LAYERS:
        raise ModelFileError(
            f"{path} gives a block count of {count!r}; llama.cpp loads 1 to "
            f"{LLAMA_MAX_LAYERS} blocks",
            "the file is damaged: download it again",
        )
    return count


def derive_gguf(source: Path, layers: Sequence[int], dest: Path) -> Path:
    """Write ``dest``, a GGUF of the blocks ``layers`` of ``source`` (module docstring)."""
    return write_derived(open_source(source), layers, dest)


def write_derived(src: Source, layers: Sequence[int], dest: Path) -> Path:
    kept = check_layers(layers, src.n_layers)
    dest = Path(dest)
    needed = derived_bytes(src, kept)
    check_disk(dest.parent, needed)
    try:
        with replacing(dest) as tmp:
            _write(src, kept, tmp)
    except OSError as err:
        if is_disk_full(err):  # filled by someone else meanwhile
            raise DownloadError(
                f"the disk is full: {dest.name} ({human(needed)}) could not be written to "
                f"{dest.parent}",
                "free some space, or set LOCALSPEC_HOME to a disk with more room, and run "
                "the command again",
            ) from None
        raise
    return dest


def derived_bytes(src: Source, kept: tuple[int, ...]) -> int:
    """About the size of the file ``kept`` derives: the source's header (its tokenizer,
    mostly) and the kept tensors' bytes, each aligned."""
    align = src.reader.alignment
    tensors = _kept_tensors(src.reader, kept)
    return src.reader.data_offset + sum(-(-t.n_bytes // align) * align for _, t in tensors)


def _write(src: Source, kept: tuple[int, ...], out: Path) -> None:
    reader = src.reader
    writer = gguf.GGUFWriter(out, src.arch, endianess=reader.endianess)
    writer.data_alignment = reader.alignment  # tensor offsets must keep the source's rule
    try:
        for field in reader.fields.values():
            # The writer adds the architecture itself; GGUF.* are the reader's virtual fields.
            if field.name == _ARCH or field.name.startswith("GGUF."):
                continue
            value, vtype, sub_type = _field_value(field)
            value = _adjusted(field.name, value, vtype, src, kept)
            writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
        if reader.get_field(_NAME) is None:
            name = _adjusted(_NAME, src.path.stem, gguf.GGUFValueType.STRING, src, kept)
            writer.add_key_value(_NAME, name, gguf.GGUFValueType.STRING)
        tensors = _kept_tensors(reader, kept)
        for name, tensor in tensors:
            data = tensor.data
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, tensor in tensors:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    finally:
        writer.close()


def _field_value(field: Any) -> tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]:
    """A metadata field as ``(value, type, array item type)``. Strings go as raw bytes, so a
    token that is not valid UTF-8 is copied as it is rather than failing to decode."""
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.STRING:
        return field.parts[field.data[0]].tobytes(), vtype, None
    if vtype != gguf.GGUFValueType.ARRAY:
        return field.contents(), vtype, None
    sub_type = field.types[-1]
    if sub_type == gguf.GGUFValueType.STRING:
        return [field.parts[i].tobytes() for i in field.data], vtype, sub_type
    return field.contents(), vtype, sub_type


def _adjusted(key: str, value: Any, vtype: Any, src: Source, kept: tuple[int, ...]) -> Any:
    if key == f"{src.arch}.block_count":
        return len(kept)
    if key == _NAME:
        name = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        return f"{name} (self-draft, layers {compact_layers(kept)})"
    # Some architectures give per-layer values (head counts, window sizes) as arrays.
    if (
        key.startswith(f"{src.arch}.")
        and vtype == gguf.GGUFValueType.ARRAY
        and len(value) == src.n_layers
    ):
        return [value[i] for i in kept]
    return value


def _kept_tensors(reader: gguf.GGUFReader, kept: tuple[int, ...]) -> list[tuple[str, Any]]:
    """``(new name, tensor)``: the kept blocks' tensors renumbered, the others as they are,
    in the source's order."""
    new_index = {old: new for new, old in enumerate(kept)}
    out = []
    for tensor in reader.tensors:
        match = _BLOCK.match(tensor.name)
        if match is None:
            out.append((tensor.name, tensor))
        elif int(match[1]) in new_index:
            out.append((f"blk.{new_index[int(match[1])]}.{match[2]}", tensor))
    return out
