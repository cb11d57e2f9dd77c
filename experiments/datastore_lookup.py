"""What one retrieval lookup costs in a datastore of ten million tokens or more.

Builds a token index (or opens the one saved in ``--dir`` before) and times lookups as the
retrieval drafter makes them: ``longest_match`` of a 32-token context, then ``continuations``
of 16 tokens over the drafter's sample of occurrences. Contexts are taken from the store
itself (every lookup matches, the longest walk), then made of random token ids (most
lookups end after a token or two). A lookup should cost well under a tenth of a plain
target step (57 ms on the 2-core machine of docs/datastore.md).

With ``--target``, the corpus is this repository's files (as ``localspec datastore add``
would read them) through that model's tokenizer, repeated until it is large enough; without
one, random documents made of phrases drawn from a shared pool, so that they share runs of
tokens as code and prose do.

    python experiments/datastore_lookup.py --target qwen2.5-coder-1.5b --dir /tmp/lookup-store
    python experiments/datastore_lookup.py --tokens 20000000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from localspec.core.drafting.store import EXAMINED
from localspec.storage.datastore import DamagedIndex, TokenIndex
from localspec.storage.indexing import time_lookups
from localspec.storage.library import disk_bytes
from localspec.storage.sources import scan

REPO = Path(__file__).resolve().parent.parent
VOCAB = 151_936  # Qwen2.5's, for random documents


def repository_documents(target: str | None, tokens: int) -> list[np.ndarray]:
    from localspec.backend.llama import LlamaModel
    from localspec.models.catalog import resolve_model

    model = LlamaModel(resolve_model(target, "target"), vocab_only=True)
    try:
        files = [
            np.asarray(model.tokenize(s.text, add_special=False, parse_special=False), np.int32)
            for s in scan([REPO], 1 << 20)
        ]
    finally:
        model.close()
    once = sum(len(f) for f in files)
    copies = -(-tokens // once)
    print(f"corpus: {len(files)} files of {REPO}, {once:,} tokens, repeated {copies} times")
    return files * copies


def random_documents(tokens: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, VOCAB, int(n)) for n in rng.integers(4, 40, 50_000)]
    popularity = 1.0 / np.arange(1, len(pool) + 1)  # Zipf: a few phrases are everywhere
    popularity /= popularity.sum()
    documents, total = [], 0
    while total < tokens:
        picks = rng.choice(len(pool), size=100, p=popularity)
        document = np.concatenate([pool[i] for i in picks]).astype(np.int32)
        documents.append(document)
        total += len(document)
    print(f"corpus: {len(documents):,} random documents of phrases from a pool of {len(pool):,}")
    return documents


def random_lookups(index: TokenIndex, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(n):
        context = rng.integers(0, VOCAB, 32).tolist()
        start = time.perf_counter()
        match = index.longest_match(context, 32, 1)
        if match is not None:
            index.continuations(match, 16, EXAMINED)
        times.append(time.perf_counter() - start)
    return times


def summary(label: str, times: list[float]) -> str:
    median = statistics.median(times) * 1000
    p95 = statistics.quantiles(times, n=20)[-1] * 1000
    return f"{label} ({len(times)}): median {median:.3f} ms, p95 {p95:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="tokenize this repository with this model's tokenizer")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="at least this many")
    parser.add_argument("--dir", type=Path, help="keep the store here (opened if present)")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    directory = args.dir or Path(tempfile.mkdtemp(prefix="localspec-lookup-"))
    try:
        index = TokenIndex.load(directory)
        print(f"opened the store in {directory}")
    except DamagedIndex:
        documents = (
            repository_documents(args.target, args.tokens)
            if args.target
            else random_documents(args.tokens, args.seed)
        )
        start = time.perf_counter()
        TokenIndex.build(documents).save(directory)
        print(f"built and saved in {time.perf_counter() - start:.1f} s")
        del documents
    start = time.perf_counter()
    index = TokenIndex.load(directory)
    opened = (time.perf_counter() - start) * 1000
    print(
        f"store: {len(index):,} tokens in {index.documents:,} documents, "
        f"{disk_bytes(directory) / 1e6:.0f} MB on disk in {directory}, opened in {opened:.1f} ms"
    )
    time_lookups(index, 200, args.seed + 1)  # the pages a lookup touches, read once
    print(
        summary("lookups of contexts from the store", time_lookups(index, args.lookups, args.seed))
    )
    print(summary("lookups of random tokens", random_lookups(index, args.lookups, args.seed)))


if __name__ == "__main__":
    main()
