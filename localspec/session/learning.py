"""What the controller learned, kept per model pair so the next process starts warm.

``LearningStore(directory)`` keeps one JSON file per pair key: the acceptance evidence of
``Controller.learned()`` with a format version and the key it belongs to. ``load`` returns
that evidence, or None with a reason when the file is missing, unreadable, of another
version or of another pair, so a damaged or foreign file is ignored, never fatal. ``save`` is
best effort (``store.write_json``): a failure is reported, not raised. The evidence is
discounted when a controller restores it (``Controller.restore``), so what a new session
sees soon outweighs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localspec.session.store import remove_json, write_json

FORMAT = 2  # 2: n-gram evidence as copies per text and streaks per bucket


class LearningStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> tuple[dict[str, Any] | None, str]:
        """``(evidence, "")``, or ``(None, why)``; ``why`` is empty when there is no file."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, ""
        except (OSError, ValueError) as err:
            return None, f"ignoring unreadable learned state {path}: {err}"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None, f"ignoring learned state {path}: not a format {FORMAT} file"
        if data.get("pair") != key or not isinstance(data.get("learned"), dict):
            return None, f"ignoring learned state {path}: it belongs to another model pair"
        return data["learned"], ""

    def save(self, key: str, learned: dict[str, Any]) -> str:
        """Best effort: returns "" or why ``learned`` could not be saved for ``key``."""
        return write_json(self.path(key), {"format": FORMAT, "pair": key, "learned": learned})

    def forget(self) -> int:
        """Delete every pair's file; returns how many there were."""
        return remove_json(self.directory)
