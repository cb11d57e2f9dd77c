"""``localspec bench costs``: this machine's costs as a cost profile to keep."""

from __future__ import annotations

import json

from localspec.bench.costs import machine
from localspec.core.costs import CostProfile
from tests.test_cli import assert_clean_error, localspec, pair_args

ZEN3 = """processor\t: 0
model name\t: AMD Ryzen 5 5500U with Radeon Graphics
flags\t\t: fpu vme sse2 avx fma avx2 bmi2
"""


def test_the_machine_is_named_by_its_cpu_and_its_vector_extensions():
    assert machine(ZEN3).startswith("AMD Ryzen 5 5500U with Radeon Graphics; ")
    assert machine(ZEN3).endswith("cores; avx2 fma")
    avx512 = ZEN3.replace("avx2", "avx2 avx512f avx512_vnni")
    assert machine(avx512).endswith("avx512f avx512_vnni avx2 fma")
    assert "none of avx512f" in machine("model name : a CPU\nflags : sse2\n")


def test_the_profile_is_measured_and_written_as_replay_reads_it(tiny_pair, tmp_path):
    out = tmp_path / "here.json"
    proc = localspec("bench", "costs", *pair_args(tiny_pair), "--out", str(out), env_home=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(out.read_text(encoding="utf-8"))
    profile = CostProfile.from_dict(data)  # what bench replay --costs reads
    assert profile.plain_s > 0 and profile.verify_s and profile.draft_step_s
    assert data["machine"] and data["pair"]
    assert f"wrote {out}" in proc.stderr.decode()
    bad = localspec("bench", "costs", *pair_args(tiny_pair), "--out", str(tmp_path / "no" / "x"),
                    env_home=tmp_path)  # fmt: skip
    assert_clean_error(bad, "cannot write", "no folder")
