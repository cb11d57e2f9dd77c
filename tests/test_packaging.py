"""A wheel installed without ``-e`` works on its own: the catalog ships inside the package."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def test_wheel_installed_into_a_fresh_venv_resolves_the_default_pair(tmp_path):
    dist = tmp_path / "dist"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(REPO)]
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("localspec-*.whl"))

    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)]).returncode == 0
    py = venv / "bin" / "python"
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                .stdout.strip())  # fmt: skip
    # The dependencies come from this environment, appended after the venv's own
    # site-packages; this environment's editable localspec is not visible from there.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
         str(wheel)]
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    model = home / "models" / "qwen2.5-coder-1.5b.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "HF_HOME": str(tmp_path / "hf")}
    probe = "import localspec; print(localspec.__file__)"
    where = run([str(py), "-c", probe], cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    cli = venv / "bin" / "localspec"
    listed = run([str(cli), "models", "list"], cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "qwen2.5-coder-1.5b" in listed.stdout and "qwen2.5-coder-0.5b" in listed.stdout
    path = run([str(cli), "models", "path", "qwen2.5-coder-1.5b"], cwd=tmp_path, env=env)
    assert path.returncode == 0, path.stderr
    assert path.stdout.strip() == str(model)
