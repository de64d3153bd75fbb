"""The one text normaliser: what "the same text" means for de-duplication, label conflicts and leaks."""

from __future__ import annotations

import re
import unicodedata

__all__ = ["NORMALIZE_VERSION", "normalize_text"]

NORMALIZE_VERSION = "casefold-nfkc-ws-punct-1"  # in the data recipe: changing it changes the data version

# A run of punctuation/symbol characters (or `_`, which `\w` includes); the callback keeps runs inside words.
# Cheaper than lookarounds in the pattern, which the engine would try at every position.
_PUNCT_RUN = re.compile(r"(?:[^\w\s]|_)+")


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "P"


def _strip_edge_punct(match: re.Match[str]) -> str:
    """Drop the punctuation (Unicode category P*) of a run at a word edge; symbols such as `$`, `+`, emoji
    stay, and so does a run inside a word."""
    run, text = match.group(), match.string
    start, end = match.start(), match.end()
    if start == 0 or text[start - 1].isspace():
        i = 0
        while i < len(run) and _is_punct(run[i]):
            i += 1
        run = run[i:]
    if end == len(text) or text[end].isspace():
        j = len(run)
        while j > 0 and _is_punct(run[j - 1]):
            j -= 1
        run = run[:j]
    return run


def normalize_text(text: str) -> str:
    """Casefold, Unicode NFKC, collapse whitespace, strip punctuation at word edges.

    The one notion of "the same text" in rentune: exact de-duplication, the check for one text under two
    labels and the leak check between splits (exact, and as input to shingling) all compare this. Words
    of the result are separated by one space.
    Punctuation inside a word stays (`don't`, `e.g`, `3.5`); a word made only of punctuation disappears.
    Idempotent. Raises TypeError if `text` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    # NFKC first so that compatibility forms (fullwidth, ligatures, black-letter capitals) get casefolded;
    # NFKC again because casefolding can leave a string that is not in NFKC.
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(_PUNCT_RUN.sub(_strip_edge_punct, folded).split())
