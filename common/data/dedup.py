"""Which examples are copies of one text, so that the splits keep every copy on the same side.

Two texts are the same text when their :func:`text_key` is equal: Unicode NFKC, runs of whitespace
as one space, no leading or trailing space, case folded. That catches the copies found in the
packaged corpora (the same review once capitalised, once not; the same article with its paragraph
breaks moved) and nothing more: texts that differ in a word stay distinct.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np


def text_key(text: str) -> str:
    """``text`` normalised for duplicate detection: NFKC, whitespace collapsed and stripped, casefolded."""
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()


def text_groups(texts: Sequence[str]) -> np.ndarray:
    """``groups[i]``: the index of the first text with the same :func:`text_key` as ``texts[i]``
    (``i`` itself for a text that occurs once), so ``groups == arange(n)`` when nothing repeats."""
    first: dict[str, int] = {}
    return np.fromiter(
        (first.setdefault(text_key(t), i) for i, t in enumerate(texts)), dtype=np.int64, count=len(texts)
    )


def keep_together(parts: Sequence[np.ndarray], groups: np.ndarray) -> tuple[np.ndarray, ...]:
    """Disjoint index arrays ``parts``, each returned sorted, with every copy of a text moved to the
    part that holds the copy with the lowest index among them (``groups`` as from :func:`text_groups`,
    indexed by the same indices). The lowest index is the text's first occurrence, whose side a seeded
    split drew independently of the text, so a repeated text is no likelier than any other to land on
    one side. Parts are unchanged (only sorted) when no text has copies in two of them."""
    if not parts:
        return ()
    idx = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    side = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    order = np.argsort(idx, kind="stable")
    idx, side = idx[order], side[order]
    _, first, inverse = np.unique(np.asarray(groups)[idx], return_index=True, return_inverse=True)
    dest = side[first][inverse.reshape(-1)]
    return tuple(idx[dest == k] for k in range(len(parts)))


__all__ = ["keep_together", "text_groups", "text_key"]
