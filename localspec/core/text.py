"""Incremental text assembly from token bytes, with stop strings held back.

Tokens carry bytes, and a UTF-8 character may span tokens, so text is decoded
incrementally. With stop strings, text that could still turn into a stop string is held
back until it cannot, so a streaming front end never prints part of a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextAssembler:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self.text = ""  # everything decoded so far (cut at a stop string once one matched)
        self._released = 0
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that may be shown now."""
        self.text += self._decoder.decode(data)
        for stop in self._stops:
            idx = self.text.find(stop, max(0, self._released - len(stop) + 1))
            if idx >= 0:
                self.text = self.text[:idx]
                self.stopped = True
                return self._release(len(self.text))
        return self._release(len(self.text) - self._held_back())

    def finish(self) -> str:
        """Release what was held back (generation ended without a stop string)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._release(len(self.text))

    def _held_back(self) -> int:
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self.text)), hold, -1):
                if self.text.endswith(stop[:k]):
                    hold = k
                    break
        return hold

    def _release(self, end: int) -> str:
        end = max(end, self._released)
        out = self.text[self._released : end]
        self._released = end
        return out
