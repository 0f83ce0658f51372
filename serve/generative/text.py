"""A sequence's tokens as text, a piece per step: incremental detokenizing and stop strings.

A token can end in the middle of a character (byte-level BPE) or change how the tokens before it
read, so each step decodes a short window of the ids, not all of them, and holds back text until
it is whole. Text that could still become a stop string is held back too: a stream never sends
the start of a stop string it later cuts.
"""

from __future__ import annotations

INCOMPLETE = "\ufffd"  # what decoding yields for a character whose bytes are not all there yet


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self._prefix = self._read = 0
        self.text = ""  # decoded so far
        self.sent = 0  # characters of `text` handed out
        self.stopped = False

    def push(self, token: int) -> str:
        """Adds one generated token; returns the text now safe to send ("" where none is).
        After a stop string appears, `stopped` is set and the text ends before it."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(INCOMPLETE):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
        return self._release()

    def flush(self) -> str:
        """At the end: whatever is held back and not part of a stop string."""
        if not self.stopped:
            tail = self._decode(self.ids[self._prefix:])[
                len(self._decode(self.ids[self._prefix:self._read])):]
            self.text += tail.rstrip(INCOMPLETE)
        return self._release(final=True)

    def _release(self, final: bool = False) -> str:
        if self.stop and not self.stopped:
            cut = min((i for i in (self.text.find(s, max(self.sent - len(s) + 1, 0))
                                   for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text) if final or self.stopped else len(self.text) - self._held()
        piece = self.text[self.sent:max(end, self.sent)]
        self.sent += len(piece)
        return piece

    def _held(self) -> int:
        """How many trailing characters could be the start of a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
