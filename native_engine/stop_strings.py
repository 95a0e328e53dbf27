"""A request's stop strings, matched in one pass per token however many there are.

Text only grows, and what was there before a token was checked then: a stop string this token completes
ends inside its new characters. So for each new character and each distinct length of stop string, one set
lookup of the text that ends there: the work per token is (new characters) x (distinct lengths), not
(stop strings) x (characters scanned). One `str.find` per stop string per token let one request with
150,000 stop strings slow the other streams' ITL 1.2x (issue 37).
"""

from __future__ import annotations

# OpenAI takes at most 4 stop strings, vLLM any number. Past these a request is refused (a 400 naming
# `stop`): each distinct length costs a lookup per streamed character, and the longest, less one
# character, is the text held back from the stream until it can no longer begin a stop string.
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 256


def check_stop(stop: list) -> None:
    """Raises ValueError("stop: ...") unless stop is a list of at most MAX_STOP_STRINGS non-empty strings
    of at most MAX_STOP_CHARS characters; the count is checked first, before the list is walked."""
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(
            f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}; send the few that end an answer"
        )
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError("stop: must be a non-empty string or a list of them")
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(
            f"stop: a stop string may have at most {MAX_STOP_CHARS} characters, got one of {longest}; "
            "send the shortest text that ends an answer"
        )


class StopStrings:
    def __init__(self, stop: list[str]):
        self.strings = frozenset(stop)
        self.lengths = sorted({len(s) for s in stop})  # ascending: at one end, the shorter match first
        self.longest = self.lengths[-1] if self.lengths else 0

    def first_in(self, text: str, num_checked_chars: int) -> tuple[int, str] | None:
        """(where it starts, which) of the stop string that starts first in text (at one start, the shorter,
        as `min` over (index, string) would pick), among those ending past text[:num_checked_chars]."""
        first = None
        for end in range(num_checked_chars + 1, len(text) + 1):
            for length in self.lengths:
                start = end - length
                if start < 0:
                    break
                if (first is None or start < first[0]) and text[start:end] in self.strings:
                    first = (start, text[start:end])
        return first
