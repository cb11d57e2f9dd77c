"""Where localspec keeps its files.

Contract:

- ``cache_root()`` is ``$LOCALSPEC_HOME`` when set (tests point it at a tmp dir), else the
  platform's user cache dir for "localspec". Nothing here creates directories; callers that
  write use ``ensure_dir``.
- Verified models live in ``models_dir()`` as ``<name>.gguf``; half-fetched data lives in
  ``downloads_dir(name)`` until the model is verified, then it is deleted.
- ``registry_path()`` is a small JSON file naming models made on this machine (requantized
  copies) so they resolve by name like catalog entries.
- ``conversations_dir()`` holds the chats ``localspec chat`` saves, one JSON file each.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV_HOME = "LOCALSPEC_HOME"


def cache_root() -> Path:
    home = os.environ.get(ENV_HOME)
    if home:
        return Path(home).expanduser()
    return Path(platformdirs.user_cache_dir("localspec"))


def models_dir() -> Path:
    return cache_root() / "models"


def downloads_dir(name: str) -> Path:
    return cache_root() / "downloads" / name


def registry_path() -> Path:
    return models_dir() / "registry.json"


def conversations_dir() -> Path:
    return cache_root() / "conversations"


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def prompt_cache_dir() -> Path:
    """Saved prompt states (storage/prompt_cache.py), one folder per pair and recipe."""
    return cache_root() / "prompt-cache"
