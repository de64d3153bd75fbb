"""The one text normaliser: what "the same text" means for de-duplication, label conflicts and leaks."""

from __future__ import annotations

import functools
import sys
import unicodedata

__all__ = ["NORMALIZE_VERSION", "normalize_text"]

NORMALIZE_VERSION = "casefold-nfkc-ws-punct-1"  # in the data recipe: changing it changes the data version


@functools.cache
def _punctuation() -> tuple[str, frozenset[str]]:
    """Every Unicode punctuation character (category P*), as a string for str.strip and as a set; built
    once per process from unicodedata (about 0.3 s)."""
    chars = "".join(chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code))[0] == "P")
    return chars, frozenset(chars)


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
    # One pass over the words: each loses the punctuation at its edges (str.strip stops at the first
    # character that is not punctuation, so `$`, `+` and what is inside the word stay). Only a word that
    # starts or ends with punctuation is stripped: most do neither.
    chars, edge = _punctuation()
    words = []
    for word in folded.split():
        if word[0] in edge or word[-1] in edge:
            word = word.strip(chars)
            if not word:
                continue
        words.append(word)
    return " ".join(words)
