"""The GGUF header reader against crafted headers: every length is bounded by the file, so a
hostile file fails fast with ``ValueError`` (and the memory estimate falls back to 0)
instead of allocating gigabytes or looping for ever."""

from __future__ import annotations

import json
import struct
import time

import pytest

from localspec.models import gguf, resources


def header(*kvs: bytes, n_kv: int | None = None) -> bytes:
    body = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0)
    body += struct.pack("<Q", len(kvs) if n_kv is None else n_kv)
    return body + b"".join(kvs) + b"\0" * 64


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(value)


def with_block_count(path, count: int):
    """A llama GGUF header at ``path`` that gives ``count`` blocks (and nothing else)."""
    path.write_bytes(header(kv_string("general.architecture", "llama"),
                            s("llama.block_count") + struct.pack("<II", 4, count)))  # fmt: skip
    return path


HUGE = 1 << 62
ARRAY, STRING, FLOAT32 = 9, 8, 6
CRAFTED = {
    # a key whose length would make the reader allocate exabytes
    "key length": struct.pack("<Q", HUGE) + b"x",
    "string value length": s("general.name") + struct.pack("<IQ", STRING, HUGE),
    # an array of floats that would seek past any offset a file can have
    "array of numbers": s("scores") + struct.pack("<IIQ", ARRAY, FLOAT32, HUGE),
    "array of strings": s("tokens") + struct.pack("<IIQ", ARRAY, STRING, HUGE),
    # arrays of arrays nested deeper than the interpreter's recursion limit
    "nested arrays": s("deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 5000,
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_lengths_fail_fast_with_value_error(tmp_path, name):
    path = tmp_path / f"{name.replace(' ', '-')}.gguf"
    path.write_bytes(header(CRAFTED[name]))
    start = time.process_time()
    with pytest.raises(ValueError):
        gguf.read_metadata(path)
    assert time.process_time() - start < 5  # a guard against an endless loop, not a benchmark
    assert resources.kv_cache_bytes(path, 4096) == 0


def test_a_huge_key_count_is_refused(tmp_path):
    path = tmp_path / "count.gguf"
    path.write_bytes(header(kv_string("general.name", "x"), n_kv=HUGE))
    with pytest.raises(ValueError, match="key/value count"):
        gguf.read_metadata(path)


def test_a_sound_header_still_reads(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(header(kv_string("general.name", "tiny"), kv_string("a.b", "c")))
    assert gguf.read_metadata(path) == {"general.name": "tiny", "a.b": "c"}


def kv_strings(key: str, values: list[str]) -> bytes:
    return s(key) + struct.pack("<IIQ", ARRAY, STRING, len(values)) + b"".join(map(s, values))


def test_a_vocabulary_is_stepped_over_and_the_keys_after_it_still_read(tmp_path):
    path = tmp_path / "vocab.gguf"
    tokens = [f"tok{i}" for i in range(50_000)]
    path.write_bytes(
        header(kv_strings("tokenizer.ggml.tokens", tokens), kv_string("general.name", "after"))
    )
    assert gguf.read_metadata(path) == {"tokenizer.ggml.tokens": None, "general.name": "after"}


def test_a_string_in_an_array_that_runs_past_the_end_is_refused(tmp_path):
    path = tmp_path / "short.gguf"
    second = struct.pack("<Q", 1000) + b"only a few bytes"  # says 1000 bytes, has fewer
    array = s("tokens") + struct.pack("<IIQ", ARRAY, STRING, 2) + s("a") + second
    path.write_bytes(header(array)[:-64])
    with pytest.raises(ValueError):
        gguf.read_metadata(path)


def test_a_header_is_read_once_per_process_until_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "once.gguf"
    path.write_bytes(header(kv_string("general.name", "first")))
    reads = []
    real = gguf._read_header
    monkeypatch.setattr(gguf, "_read_header", lambda *a: reads.append(1) or real(*a))
    assert gguf.read_metadata(path)["general.name"] == "first"
    assert gguf.read_metadata(path)["general.name"] == "first"
    assert len(reads) == 1
    path.write_bytes(header(kv_string("general.name", "second!")))
    assert gguf.read_metadata(path)["general.name"] == "second!" and len(reads) == 2


def test_a_header_is_kept_on_disk_for_the_next_process(tmp_path, monkeypatch):
    path = tmp_path / "kept.gguf"
    path.write_bytes(header(kv_string("general.name", "kept")))
    assert gguf.read_metadata(path)["general.name"] == "kept"
    monkeypatch.setattr(gguf, "_READ_CACHE", {})  # a new process
    monkeypatch.setattr(gguf, "_read_header", lambda *a: pytest.fail("read again"))
    assert gguf.read_metadata(path) == {"general.name": "kept"}


@pytest.mark.parametrize(
    "damage",
    ['{"x": ', "[]", '{"%s": {"stamp": 1, "values": {}}}', '{"%s": {"values": {"a": {}}}}'],
)
def test_a_damaged_header_cache_is_read_past(tmp_path, monkeypatch, damage):
    path = tmp_path / "damaged.gguf"
    path.write_bytes(header(kv_string("general.name", "real")))
    assert gguf.read_metadata(path)["general.name"] == "real"
    cache = gguf._cache_file()
    text = damage % str(path.resolve()) if "%s" in damage else damage
    if "values" in damage and "stamp" not in damage:
        kept = json.loads(cache.read_text())[str(path.resolve())]
        text = json.dumps({str(path.resolve()): {"stamp": kept["stamp"], "values": {"a": {}}}})
    cache.write_text(text)
    monkeypatch.setattr(gguf, "_READ_CACHE", {})
    assert gguf.read_metadata(path) == {"general.name": "real"}
