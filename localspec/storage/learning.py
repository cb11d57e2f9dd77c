"""What auto's drafters learned, kept per model pair so the next process starts warm.

``LearningStore(directory)`` keeps one JSON file per pair key: the acceptance evidence of
``SpecDecoder.learned()`` (one entry per drafter) with a format version and the key it
belongs to. ``load`` returns that evidence, or None with a reason when the file is missing,
unreadable, of an unknown version or of another pair, so a damaged or foreign file is
ignored, never fatal; a file of the previous format (2, which held the n-gram drafter's
evidence at the top level and the datastore's nested) is read into the current one. ``save``
is best effort (``statefiles.write_json``): a failure is reported, not raised. The evidence is
discounted when the drafters restore it, so what a new session sees soon outweighs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localspec.statefiles import STATE_ERRORS, read_json, remove_json, write_json

FORMAT = 3  # 3: one entry per drafter, by name


class LearningStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> tuple[dict[str, Any] | None, str]:
        """``(evidence, "")``, or ``(None, why)``; ``why`` is empty when there is no file."""
        path = self.path(key)
        data, problem = read_json(path)
        if data is None:
            return None, problem and f"ignoring unreadable learned state: {problem}"
        if not isinstance(data, dict) or data.get("format") not in (2, FORMAT):
            return None, f"ignoring learned state {path}: not a format {FORMAT} file"
        if data.get("pair") != key or not isinstance(data.get("learned"), dict):
            return None, f"ignoring learned state {path}: it belongs to another model pair"
        if data["format"] == 2:
            try:
                return from_format_2(data["learned"]), ""
            except STATE_ERRORS as err:
                return None, f"ignoring learned state {path}: malformed ({err})"
        return data["learned"], ""

    def save(self, key: str, learned: dict[str, Any]) -> str:
        """Best effort: returns "" or why ``learned`` could not be saved for ``key``."""
        return write_json(self.path(key), {"format": FORMAT, "pair": key, "learned": learned})

    def forget(self) -> int:
        """Delete every pair's file; returns how many there were."""
        return remove_json(self.directory)


def from_format_2(learned: dict[str, Any]) -> dict[str, Any]:
    """Format 2's evidence as format 3's: the n-gram drafter's copies and streaks and the
    draft model's estimate were at the top level, the datastore's under ``store``."""
    drafters = {
        "ngram": {"copies": learned["copies"], "streaks": learned["streaks"]},
        "model": learned["model"],
    }
    if "store" in learned:  # absent from files saved before the datastore drafter
        drafters["store"] = learned["store"]
    return {"drafters": drafters}
