"""The Chit-Chat Challenge conversations as a chat corpus with natural users (issue 76).

The texts ship in the ``chitchat-dataset`` 0.9.0 wheel (BYU PCC lab's Chit-Chat Challenge, MIT
licence, ``chitchat_dataset/dataset.json``): 7,168 conversations between volunteers, each
``{"messages": [[{"text", "timestamp", "sender"}, ...], ...], ...}``, one inner list per turn (one
sender's consecutive messages, joined here with newlines). 3,150 of them have one sender (nobody
answered) and are dropped.

**Each side of a conversation is its sender's data**, as a phone holds a chat: from sender S's side,
S's turns are the ``assistant``'s (the loss covers them) and the partner's are the ``user``'s. A
side is cut into pieces of at most :data:`PIECE_TURNS` turns (a piece without a turn of S's is
dropped); every piece is one text whose user is S, so ``--partition natural`` makes one client per
sender and a client-level guarantee is **user-level**: adjacent datasets differ in one sender's
sides of their conversations (their partners' words in them included, as on a device). The
partner's words are also on the partner's side, their own data.

**Held-out senders**: a sender is held out when a salted SHA-256 of their id falls in the lowest
:data:`HELD_OUT_FRACTION` of the hash range (fixed whatever the run's seed). Every conversation a
held-out sender took part in is test data, from the held-out sender's side only, and no side of it
is training data: the test senders and their conversations are never seen in training.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from common.assets import asset_file
from common.data.conversation import RESPONSE_ROLE, TASK, Conversation, dumps

NAME = "chitchat"  # the packaged dataset (common/data/corpora.py)
LICENCE = "MIT (chitchat-dataset 0.9.0 METADATA: BYU-PCCL/chitchat-dataset)"
#: the most turns one text holds (a side of a conversation is cut into pieces of this many)
PIECE_TURNS = 6
#: the share of senders held out (by a hash of their id) as unseen test users
HELD_OUT_FRACTION = 0.2
_SALT = b"fedlora chitchat held-out senders v1\0"


@dataclass(frozen=True)
class Turn:
    """One sender's consecutive messages, joined by newlines."""

    sender: str
    text: str


def held_out(sender: str) -> bool:
    """Whether ``sender`` is a held-out (test) user: the first 64 bits of the salted SHA-256 of their
    id, as a fraction of 2**64, below :data:`HELD_OUT_FRACTION`."""
    digest = hashlib.sha256(_SALT + sender.encode()).hexdigest()
    return int(digest[:16], 16) < HELD_OUT_FRACTION * 2**64


def turns_of(record: Mapping[str, object]) -> list[Turn]:
    """A conversation record's turns, in order; empty messages dropped, and a turn that repeats the
    previous turn's sender merged into it."""
    turns: list[Turn] = []
    for messages in record.get("messages") or []:
        texts = [str(m.get("text", "")).strip() for m in messages]
        senders = {str(m.get("sender", "")) for m in messages}
        text = "\n".join(t for t in texts if t)
        if not text or len(senders) != 1:
            continue
        sender = senders.pop()
        if turns and turns[-1].sender == sender:
            turns[-1] = Turn(sender, f"{turns[-1].text}\n{text}")
        else:
            turns.append(Turn(sender, text))
    return turns


def side(turns: Sequence[Turn], sender: str, piece_turns: int = PIECE_TURNS) -> list[Conversation]:
    """``turns`` as ``sender``'s data: pieces of at most ``piece_turns`` consecutive turns from the
    partner's first turn on (an opening of the sender's answers nothing: dropped), roles
    ``assistant`` for the sender's turns and ``user`` for the partner's; a piece with no turn of the
    sender's is dropped. Turns alternate (:func:`turns_of`), so with an even ``piece_turns`` every
    piece opens with the partner's turn."""
    first = next((k for k, t in enumerate(turns) if t.sender != sender), len(turns))
    pieces = []
    for start in range(first, len(turns), piece_turns):
        piece = tuple(
            (RESPONSE_ROLE if t.sender == sender else "user", t.text)
            for t in turns[start : start + piece_turns]
        )
        if any(role == RESPONSE_ROLE for role, _ in piece):
            pieces.append(piece)
    return pieces


def conversations(path=None) -> Iterable[list[Turn]]:
    """Every conversation of two or more senders, in the order of their ids."""
    path = path or asset_file("chitchat_dataset", "dataset.json")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    for key in sorted(data):
        turns = turns_of(data[key])
        if len({t.sender for t in turns}) >= 2:
            yield turns


@cache
def chitchat_corpus():
    """The packaged conversations as a corpus (:func:`corpus_of`)."""
    return corpus_of(conversations())


def corpus_of(convs: Iterable[Sequence[Turn]]):
    """A chat corpus (task ``chat``) of ``convs``: every training sender's pieces (texts: canonical
    JSON, ``users``: the sender), then the held-out senders' pieces (:func:`held_out`) as the given
    test split; a conversation with a held-out sender gives no training piece."""
    from common.data.corpora import Corpus  # imported here: corpora imports this module lazily

    train: list[tuple[str, str]] = []
    test: list[tuple[str, str]] = []
    for turns in convs:
        senders = sorted({t.sender for t in turns})
        unseen = [s for s in senders if held_out(s)]
        rows = test if unseen else train
        for sender in unseen or senders:
            rows += [(sender, dumps(piece)) for piece in side(turns, sender)]
    rows = train + test
    return Corpus(
        NAME,
        tuple(text for _, text in rows),
        (0,) * len(rows),
        (),
        TASK,
        users=tuple(sender for sender, _ in rows),
        given_test=tuple(range(len(train), len(rows))),
    )


def training_senders() -> int:
    """How many senders hold training data (the preset's ``--num-clients``)."""
    corpus = chitchat_corpus()
    return len(set(corpus.users[: min(corpus.given_test)]))


__all__ = [
    "HELD_OUT_FRACTION",
    "LICENCE",
    "NAME",
    "PIECE_TURNS",
    "Turn",
    "chitchat_corpus",
    "conversations",
    "corpus_of",
    "held_out",
    "side",
    "training_senders",
    "turns_of",
]
