"""The prompt cache's tiers (storage/prompt_cache.py): found by the longest common prefix,
for the same key and owner only; bounded, the least recently used evicted first; entries
that a later one extends replaced; files private and written whole; damaged, foreign or
unwritable files a warning, never an exception."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest

from localspec.session.sizes import size_in_bytes
from localspec.storage.prompt_cache import (
    MEMORY,
    DiskTier,
    Entry,
    MemoryTier,
    PromptCache,
    Saved,
    as_tokens,
)

KEY = "a" * 64


def entry(tokens, state=b"", *, key=KEY, owner="", draft=None, prefill_s=0.01) -> Entry:
    state = state or bytes(range(256)) * 4 + bytes(len(tokens))
    return Entry(key, Saved(as_tokens(tokens), state), draft, "d" if draft else "", owner,
                 prefill_s)  # fmt: skip


def disk(tmp_path, limit=1 << 30) -> DiskTier:
    return DiskTier(tmp_path / "prompt-cache", limit)


def test_the_longest_common_prefix_is_found_with_its_length(tmp_path):
    for tier in (MemoryTier(1 << 30), disk(tmp_path)):
        cache = PromptCache(tier, None) if isinstance(tier, MemoryTier) else PromptCache(None, tier)
        cache.save(entry(list(range(100))), memory=True, disk=True)
        cache.save(entry([*range(50), *range(500, 600)]), memory=True, disk=True)
        found = cache.find(KEY, "", [*range(60), 7, 7], [])
        assert found is not None and found.common == 60
        assert found.entry.target.tokens.tolist() == list(range(100))
        found = cache.find(KEY, "", [*range(50), 500, 501], [])
        assert found is not None and found.common == 52
        assert cache.find(KEY, "", [9, 9, 9], []) is None


def test_another_key_or_owner_never_finds_an_entry(tmp_path):
    cache = PromptCache(MemoryTier(1 << 30), disk(tmp_path))
    cache.save(entry(list(range(100)), owner="client-a"), memory=True, disk=True)
    assert cache.find("b" * 64, "client-a", list(range(100)), []) is None
    assert cache.find(KEY, "client-b", list(range(100)), []) is None
    assert cache.find(KEY, "", list(range(100)), []) is None
    found = cache.find(KEY, "client-a", list(range(100)), [])
    assert found is not None and found.tier == MEMORY  # memory first at equal length


def test_a_longer_entry_replaces_the_ones_it_extends(tmp_path):
    tier = disk(tmp_path)
    memory = MemoryTier(1 << 30)
    for saved in (entry(list(range(100))), entry(list(range(150))), entry([*range(50), 9, 9])):
        memory.save(saved)
        tier.save(saved)
    assert len(memory) == 2 and len(tier.files()) == 2
    lengths = sorted(len(e.target.tokens) for e in memory._entries.values())
    assert lengths == [52, 150]


def test_each_tier_stays_within_its_bound_least_recently_used_first(tmp_path):
    one = entry(list(range(100))).nbytes
    tier = disk(tmp_path, limit=int(2.5 * one))
    cache = PromptCache(None, tier)
    for start in (1000, 2000, 3000):
        cache.save(entry(list(range(start, start + 100))), memory=False, disk=True)
        time.sleep(0.01)  # distinct modification times
    assert tier.nbytes <= tier.limit and len(tier.files()) == 2
    assert cache.find(KEY, "", list(range(1000, 1100)), []) is None  # the oldest went
    assert cache.find(KEY, "", list(range(2000, 2100)), []) is not None  # now the newest use
    time.sleep(0.01)
    cache.save(entry(list(range(4000, 4100))), memory=False, disk=True)
    assert cache.find(KEY, "", list(range(2000, 2100)), []) is not None
    assert cache.find(KEY, "", list(range(3000, 3100)), []) is None
    memory = MemoryTier(int(2.5 * one))
    for start in (1000, 2000, 3000):
        memory.save(entry(list(range(start, start + 100))))
    assert memory.nbytes <= memory.limit and len(memory) == 2
    # An entry larger than the bound is not kept at all.
    big = entry(list(range(100)), bytes(3 * one))
    memory.save(big)
    assert memory.best(KEY, "", as_tokens(range(100))) is None


def test_files_are_private_and_the_content_comes_back_whole(tmp_path):
    tier = disk(tmp_path)
    draft = Saved(as_tokens(range(80)), b"draft-state" * 100)
    saved = entry(list(range(100)), b"target-state" * 1000, draft=draft, prefill_s=0.02)
    assert tier.save(saved) == ""
    (path,) = tier.files()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(tier.root.stat().st_mode) == 0o700
    found = tier.best(KEY, "", as_tokens(range(100)), [])
    assert found is not None
    back = found[0]
    assert back.target.state == saved.target.state and back.prefill_s == 0.02
    assert back.draft is not None and back.draft.state == draft.state
    assert np.array_equal(back.draft.tokens, draft.tokens) and back.draft_key == "d"
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "foreign", "empty", "header"],
)
def test_a_damaged_file_is_skipped_with_a_warning_and_removed(tmp_path, damage):
    tier = disk(tmp_path)
    tier.save(entry(list(range(100)), b"x" * 5000))
    (path,) = tier.files()
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-100]
    elif damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "foreign":
        data = bytearray(b"GGUF" + bytes(200))
    elif damage == "empty":
        data = bytearray()
    else:
        data[20:30] = b"{not json!"
    path.write_bytes(bytes(data))
    warnings: list[str] = []
    assert tier.best(KEY, "", as_tokens(range(100)), warnings) is None
    assert len(warnings) == 1 and "skipped" in warnings[0]
    assert not path.exists()


def test_a_read_only_home_is_a_warning(tmp_path, monkeypatch):
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    problem = PromptCache(None, disk(tmp_path)).save(entry(list(range(100))), memory=False,
                                                     disk=True)  # fmt: skip
    assert problem.startswith("could not save the prompt") and "Read-only" in problem


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    tier = disk(tmp_path)
    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    problem = tier.save(entry(list(range(100))))
    monkeypatch.setattr(os, "replace", real_replace)
    assert "No space left on device" in problem
    assert tier.files() == []
    assert not list(tier.root.rglob("*.tmp"))


def test_clearing_removes_every_file(tmp_path):
    tier = disk(tmp_path)
    tier.save(entry(list(range(100))))
    tier.save(entry(list(range(200, 300)), key="c" * 64))
    assert tier.clear() == 2 and tier.files() == []


@pytest.mark.parametrize(
    ("text", "size"),
    [("64MB", 64_000_000), ("64MiB", 64 << 20), ("2G", 2 << 30), ("1.5GB", 1_500_000_000),
     ("4096", 4096), ("0", 0), (" 10 kb ", 10_000)],
)  # fmt: skip
def test_sizes_as_people_write_them(text, size):
    assert size_in_bytes(text) == size


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "10 parsecs", "1e9", "10MB5"])
def test_what_is_not_a_size(text):
    assert size_in_bytes(text) is None


def test_two_writers_at_once_leave_whole_files(tmp_path):
    import threading

    tiers = [disk(tmp_path), disk(tmp_path)]  # two processes' views of one folder
    same = entry(list(range(300)), b"s" * 200_000)

    def write(tier: DiskTier) -> None:
        for _ in range(5):
            assert tier.save(same) == ""

    threads = [threading.Thread(target=write, args=(tier,)) for tier in tiers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    warnings: list[str] = []
    found = tiers[0].best(KEY, "", as_tokens(range(300)), warnings)
    assert found is not None and found[0].target.state == same.target.state
    assert warnings == [] and len(tiers[0].files()) == 1
    assert not list(tiers[0].root.rglob("*.tmp"))
