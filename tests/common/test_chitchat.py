"""The chitchat corpus (common/data/chitchat.py): turns, each sender's side, held-out senders."""

from __future__ import annotations

import json
from itertools import count, islice

from common.data.chitchat import (
    Turn,
    chitchat_corpus,
    corpus_of,
    held_out,
    side,
    training_senders,
    turns_of,
)
from common.data.conversation import loads
from common.presets import PRESETS


def _senders(unseen: bool, n: int) -> list[str]:
    """``n`` sender ids that are (or are not) held out."""
    return list(islice((s for s in (f"sender-{k}" for k in count()) if held_out(s) == unseen), n))


def test_turns_merge_a_senders_consecutive_messages_and_drop_empty_ones():
    record = {
        "messages": [
            [{"text": "hi", "sender": "a"}, {"text": " there ", "sender": "a"}],
            [{"text": "", "sender": "b"}],
            [{"text": "again", "sender": "a"}],
            [{"text": "hello", "sender": "b"}],
        ]
    }
    assert turns_of(record) == [Turn("a", "hi\nthere\nagain"), Turn("b", "hello")]


def test_a_side_gives_the_senders_turns_to_the_assistant_from_the_partners_first_turn():
    turns = [Turn("a" if k % 2 == 0 else "b", f"t{k}") for k in range(9)]
    pieces = side(turns, "a", piece_turns=4)
    # a's opening t0 answers nothing: the pieces start at b's t1
    assert pieces == [
        (("user", "t1"), ("assistant", "t2"), ("user", "t3"), ("assistant", "t4")),
        (("user", "t5"), ("assistant", "t6"), ("user", "t7"), ("assistant", "t8")),
    ]
    # b's side starts at t0; its last piece (t8, a's alone) holds no turn of b's: dropped
    assert side(turns, "b", piece_turns=4) == [
        (("user", "t0"), ("assistant", "t1"), ("user", "t2"), ("assistant", "t3")),
        (("user", "t4"), ("assistant", "t5"), ("user", "t6"), ("assistant", "t7")),
    ]


def test_held_out_senders_and_their_conversations_never_reach_training():
    seen, unseen = _senders(False, 3), _senders(True, 1)
    convs = [
        [Turn(seen[0], "q"), Turn(seen[1], "a"), Turn(seen[0], "b")],
        [Turn(unseen[0], "x"), Turn(seen[2], "y"), Turn(unseen[0], "z")],
    ]
    corpus = corpus_of(convs)
    first_test = min(corpus.given_test)
    train_users, test_users = set(corpus.users[:first_test]), set(corpus.users[first_test:])
    assert train_users == {seen[0], seen[1]} and test_users == {unseen[0]}
    assert not any("y" in text or "x" in text for text in corpus.texts[:first_test])
    # the held-out sender's side only: their turns are the assistant's
    assert [loads(t) for t in corpus.texts[first_test:]] == [(("user", "y"), ("assistant", "z"))]
    assert corpus.task == "chat" and all(json.loads(t) for t in corpus.texts)


def test_the_held_out_share_is_near_its_fraction_and_fixed():
    ids = [f"id-{k}" for k in range(4000)]
    share = sum(map(held_out, ids)) / len(ids)
    assert 0.18 < share < 0.22
    assert [held_out(i) for i in ids[:50]] == [held_out(i) for i in ids[:50]]


def test_the_packaged_corpus_has_the_presets_number_of_training_senders():
    corpus = chitchat_corpus()
    first_test = min(corpus.given_test)
    assert training_senders() == PRESETS["smollm2-chitchat-xdev"]["num_clients"]
    assert not set(corpus.users[:first_test]) & set(corpus.users[first_test:])
    assert all(held_out(u) for u in corpus.users[first_test:])
    assert all(loads(t)[0][0] == "user" for t in corpus.texts[:: max(1, len(corpus) // 500)])
