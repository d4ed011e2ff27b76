"""A data owner's instruction data as a corpus of conversations (issue 76; common/data/instructions.py
through common/data/files.py): the alpaca, prompt-completion and chat forms in JSONL, CSV and
Parquet files or a train/test directory, detected or named, each bad row one line."""

from __future__ import annotations

import csv
import json
import sys
import types

import pytest

from common.config import INSTRUCTION_FORMATS, RunConfig
from common.data import conversation, instructions
from common.data.federated import SplitSettings, federated_split
from common.data.files import SKIP_HINT, Columns, load_file_corpus
from common.errors import FedloraError
from tests.conftest import run_cli

ALPACA = [
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Translate to French.", "input": "cat", "output": "chat"},
    {"instruction": "Be brief.", "input": "Why?", "output": "Because.", "system": "You are terse."},
]
PROMPTS = [{"prompt": "2 + 2 =", "completion": "4"}, {"prompt": "Capital of France?", "completion": "Paris"}]
CHATS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Sky colour?"},
        {"role": "assistant", "content": "Blue"},
        {"role": "user", "content": "Grass?"},
        {"role": "assistant", "content": "Green"},
    ],
]
ALPACA_TURNS = [
    (("user", "Name a colour."), ("assistant", "Blue.")),
    (("user", "Translate to French.\n\ncat"), ("assistant", "chat")),
    (("system", "You are terse."), ("user", "Be brief.\n\nWhy?"), ("assistant", "Because.")),
]
PROMPT_TURNS = [
    (("user", "2 + 2 ="), ("assistant", "4")),
    (("user", "Capital of France?"), ("assistant", "Paris")),
]
CHAT_TURNS = [tuple((m["role"], m["content"]) for m in chat) for chat in CHATS]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)
    return path


def _turns(corpus):
    """The conversations of a chat corpus, read back from its texts."""
    return [conversation.loads(t) for t in corpus.texts]


def _chat_corpus(corpus, turns, users=()):
    assert corpus.task == conversation.TASK and corpus.label_names == () and corpus.skipped == ()
    assert _turns(corpus) == list(turns) and corpus.labels == (0,) * len(turns)
    assert corpus.texts == tuple(conversation.dumps(t) for t in turns) and corpus.users == users


@pytest.mark.parametrize(
    ("rows", "turns"),
    [(ALPACA, ALPACA_TURNS), (PROMPTS, PROMPT_TURNS), ([{"messages": c} for c in CHATS], CHAT_TURNS)],
)
def test_each_form_in_jsonl_is_a_corpus_of_conversations(tmp_path, rows, turns):
    _chat_corpus(load_file_corpus(str(_jsonl(tmp_path / "data.jsonl", rows))), turns)


def test_alpaca_in_csv_with_an_empty_input_and_an_optional_system_column(tmp_path):
    header = ["instruction", "input", "output", "system"]
    rows = [[r["instruction"], r["input"], r["output"], r.get("system", "")] for r in ALPACA]
    _chat_corpus(load_file_corpus(str(_csv(tmp_path / "a.csv", header, rows))), ALPACA_TURNS)


def test_prompt_and_response_columns_name_a_csv_s_own_columns_and_imply_the_form(tmp_path):
    path = _csv(
        tmp_path / "qa.csv",
        ["question", "answer", "id"],
        [[r["prompt"], r["completion"], "x"] for r in PROMPTS],
    )
    with pytest.raises(FedloraError, match="no text column 'text'"):  # not instruction data: as before
        load_file_corpus(str(path))
    _chat_corpus(load_file_corpus(str(path), Columns(prompt="question", response="answer")), PROMPT_TURNS)
    named = Columns(instruction_format="prompt-completion", prompt="question", response="answer")
    _chat_corpus(load_file_corpus(str(path), named), PROMPT_TURNS)


def test_chat_in_csv_is_a_json_cell(tmp_path):
    path = _csv(tmp_path / "chat.csv", ["messages"], [[json.dumps(c)] for c in CHATS])
    _chat_corpus(load_file_corpus(str(path)), CHAT_TURNS)


def test_chat_in_parquet_is_a_list_of_structs(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": c, "user": "u"} for c in CHATS]), path)
    _chat_corpus(load_file_corpus(str(path), Columns(user="user")), CHAT_TURNS, ("u", "u"))


def test_parquet_rows_as_pyarrow_gives_them_with_null_struct_fields(tmp_path, monkeypatch):
    """A Parquet struct has every field in every message: pyarrow gives an absent one as None
    (here a ``name`` only one message has), which counts as absent. Runs without pyarrow."""
    rows = [{"messages": [{**m, "name": None} for m in c]} for c in CHATS]
    rows[0]["messages"][0]["name"] = "ann"  # a field conversations do not have: a bad row
    table = types.SimpleNamespace(to_pylist=lambda: rows)
    parquet = types.ModuleType("pyarrow.parquet")
    parquet.read_table = lambda path: table
    arrow = types.ModuleType("pyarrow")
    arrow.parquet = parquet
    monkeypatch.setitem(sys.modules, "pyarrow", arrow)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", parquet)
    path = tmp_path / "chat.parquet"
    path.write_bytes(b"PAR1")
    corpus = load_file_corpus(str(path), Columns(skip_bad_rows=True))
    assert _turns(corpus) == CHAT_TURNS[1:] and corpus.skipped == (f"{path}:row 1",)


def test_a_directory_s_test_file_is_the_given_test_split_whatever_its_form(tmp_path):
    _jsonl(tmp_path / "train.jsonl", [{"messages": c, "who": f"u{k}"} for k, c in enumerate(CHATS)])
    _csv(tmp_path / "test.csv", ["prompt", "completion"], [[r["prompt"], r["completion"]] for r in PROMPTS])
    corpus = load_file_corpus(str(tmp_path), Columns(user="who"))  # the test file lacks the user column
    assert _turns(corpus) == CHAT_TURNS + PROMPT_TURNS and corpus.given_test == (2, 3)
    assert corpus.users == ("u0", "u1", "", "") and corpus.task == conversation.TASK


def test_a_directory_with_one_instruction_file_and_one_other_is_one_line(tmp_path):
    _jsonl(tmp_path / "train.jsonl", ALPACA)
    _csv(tmp_path / "test.csv", ["text", "label"], [["a", "x"], ["b", "y"]])
    with pytest.raises(FedloraError, match=r"train\.jsonl holds instruction data but .*test\.csv does not"):
        load_file_corpus(str(tmp_path))


def test_partition_by_a_user_column_makes_one_client_per_user(tmp_path):
    rows = [{"prompt": f"question {i}?", "completion": f"answer {i}", "user": f"u{i % 5}"} for i in range(40)]
    path = _jsonl(tmp_path / "qa.jsonl", rows)
    columns = Columns(user="user")
    corpus = load_file_corpus(str(path), columns)
    assert corpus.users == tuple(r["user"] for r in rows)
    split = federated_split(str(path), 3, SplitSettings(method="natural", seed=1, columns=columns))
    owners = [{corpus.users[i] for i in client} for client in split.clients]
    assert all(len(o) == 1 for o in owners) and len(set().union(*owners)) == 3


def test_a_missing_user_column_is_one_line(tmp_path):
    path = _jsonl(tmp_path / "qa.jsonl", PROMPTS)
    with pytest.raises(
        FedloraError, match=r"no --partition-by column 'user' \(columns: prompt, completion\)"
    ):
        load_file_corpus(str(path), Columns(user="user"))


@pytest.mark.parametrize(
    ("header", "form"),
    [
        (["messages", "instruction", "output"], "chat"),  # messages first
        (["instruction", "output", "prompt", "completion"], "alpaca"),
        (["id", "prompt", "completion"], "prompt-completion"),
        (["instruction", "input"], None),  # no output: not alpaca
        (["prompt", "text"], None),
    ],
)
def test_auto_picks_the_form_by_the_columns(header, form):
    got = instructions.reading(header, "auto", name="f.csv")
    assert (got.form.name if got else None) == form


def test_a_named_form_reads_its_columns_and_none_reads_the_file_as_before(tmp_path):
    path = _csv(
        tmp_path / "both.csv", ["text", "prompt", "completion"], [["t1", "p1", "c1"], ["t2", "p2", "c2"]]
    )
    corpus = load_file_corpus(str(path))
    assert _turns(corpus) == [(("user", "p1"), ("assistant", "c1")), (("user", "p2"), ("assistant", "c2"))]
    plain = load_file_corpus(str(path), Columns(instruction_format="none"))
    assert (plain.task, plain.texts) == ("lm", ("t1", "t2"))
    labelled = _csv(
        tmp_path / "labelled.csv", ["prompt", "completion", "label"], [["p", "c", "a"], ["q", "d", "b"]]
    )
    ranked = load_file_corpus(str(labelled), Columns("prompt", instruction_format="none"))
    assert (ranked.task, ranked.label_names, ranked.texts) == ("classification", ("a", "b"), ("p", "q"))
    chat = _jsonl(tmp_path / "chat.jsonl", [{"messages": c, "prompt": "x", "completion": "y"} for c in CHATS])
    assert _turns(load_file_corpus(str(chat), Columns(instruction_format="chat"))) == CHAT_TURNS
    pairs = load_file_corpus(str(chat), Columns(instruction_format="prompt-completion"))
    assert _turns(pairs) == [(("user", "x"), ("assistant", "y"))] * 2


@pytest.mark.parametrize(
    ("header", "columns", "message"),
    [
        (
            ["instruction", "input"],
            Columns(instruction_format="alpaca"),
            "--dataset {}: no 'output' column for --instruction-format alpaca (columns: instruction, input)",
        ),
        (
            ["text", "label"],
            Columns(instruction_format="alpaca"),
            "--dataset {}: no 'instruction' or 'output' column for --instruction-format alpaca (columns: text, label)",
        ),
        (
            ["text", "label"],
            Columns(instruction_format="chat"),
            "--dataset {}: no 'messages' column for --instruction-format chat (columns: text, label)",
        ),
        (
            ["q", "completion"],
            Columns(prompt="question"),
            "--dataset {}: no --prompt-column 'question' for prompt-completion data (columns: q, completion)",
        ),
        (
            ["q", "a"],
            Columns(instruction_format="prompt-completion", prompt="q"),
            "--dataset {}: no 'completion' column for --instruction-format prompt-completion (columns: q, a)",
        ),
        (
            ["prompt", "completion"],
            Columns(instruction_format="alpaca", prompt="q", response="a"),
            "--prompt-column/--response-column name a prompt-completion file's columns: not with "
            "--instruction-format alpaca",
        ),
        (
            ["prompt", "completion"],
            Columns(instruction_format="none", response="a"),
            "--response-column names a prompt-completion file's columns: not with --instruction-format none",
        ),
        (
            ["prompt", "completion", "label"],
            Columns(label="label", labels=("a", "b")),
            "--dataset {}: instruction data has no labels: drop --label-column/--labels, or read the file as "
            "before with --instruction-format none",
        ),
    ],
    ids=[
        "alpaca-output",
        "alpaca-both",
        "chat",
        "renamed-prompt",
        "named-completion",
        "rename-alpaca",
        "rename-none",
        "labels",
    ],
)
def test_missing_columns_and_clashing_options_are_one_line(tmp_path, header, columns, message):
    path = _csv(tmp_path / "f.csv", header, [["x"] * len(header)])
    with pytest.raises(FedloraError) as caught:
        load_file_corpus(str(path), columns)
    assert str(caught.value) == message.format(path)


BAD = [  # (row, problem): each after two good alpaca rows
    ({"input": "", "output": "o"}, "no 'instruction'"),
    ({"instruction": None, "output": "o"}, "no 'instruction'"),
    ({"instruction": "i", "input": "", "output": 42}, "'output' is int 42, not text"),
    ({"instruction": ["i"], "output": "o"}, "'instruction' is list ['i'], not text"),
    ({"instruction": "  ", "input": "", "output": "o"}, "'instruction' is empty"),
    ({"instruction": "i", "input": "", "output": ""}, "'output' is empty"),
    ({"instruction": "i", "input": 3, "output": "o"}, "'input' is int 3, not text"),
    ({"instruction": "i", "output": "o", "system": False}, "'system' is bool False, not text"),
]
BAD_PROMPTS = [
    ({"prompt": "", "completion": "c"}, "'prompt' is empty"),
    ({"prompt": "p", "completion": " \n"}, "'completion' is empty"),
    ({"prompt": "p"}, "no 'completion'"),
]
BAD_CHATS = [
    ([], "'messages': a conversation is a non-empty list of {role, content} messages"),
    ({"role": "user"}, "'messages': a conversation is a non-empty list of {role, content} messages"),
    (
        [{"role": "user", "content": "hi"}],
        "'messages': no non-empty assistant message: nothing to learn from",
    ),
    (
        [{"role": "bot", "content": "hi"}],
        "'messages': message 1 has role 'bot'; roles are system, user, assistant",
    ),
    (
        [{"role": "user", "content": 1}, {"role": "assistant", "content": "x"}],
        "'messages': message 1 has no text content",
    ),
    (
        [{"role": "system", "content": "s"}, {"role": "assistant", "content": "hello"}],
        "'messages': the first message after any system message must be the user's (an answer needs a prompt)",
    ),
    ("[{]", "'messages' is not JSON (Expecting property name enclosed in double quotes)"),
    (None, "no 'messages'"),
]
CASES = (
    [(ALPACA[:2], row, why) for row, why in BAD]
    + [(PROMPTS, row, why) for row, why in BAD_PROMPTS]
    + [([{"messages": c} for c in CHATS], {"messages": m}, why) for m, why in BAD_CHATS]
)


@pytest.mark.parametrize(("good", "bad", "problem"), CASES)
def test_a_bad_row_is_one_line_naming_file_and_line_or_skipped_and_counted(
    tmp_path, caplog, good, bad, problem
):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good[0]) + "\n\n" + json.dumps(bad) + "\n" + json.dumps(good[1]) + "\n")
    with pytest.raises(FedloraError) as caught:
        load_file_corpus(str(path))
    assert str(caught.value) == f"{path}:3: {problem}; {SKIP_HINT}"
    with caplog.at_level("WARNING"):
        corpus = load_file_corpus(str(path), Columns(skip_bad_rows=True))
    assert len(corpus) == 2 and corpus.skipped == (f"{path}:3",) and corpus.task == conversation.TASK
    assert f"skipped 1 bad row of 3 (--skip-bad-rows): {path}:3: {problem}" in caplog.text


def test_bad_csv_rows_name_their_line_and_csv_s_own_checks_still_apply(tmp_path, caplog):
    content = "prompt,completion\nfine,ok\n,empty prompt\nunquoted, comma,here\nalso fine,yes\n"
    path = tmp_path / "pc.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(FedloraError, match=f"^{path}:4: 3 fields, the header has 2"):  # read first
        load_file_corpus(str(path))
    path.write_text(content.replace("unquoted, comma", '"quoted, comma"'), encoding="utf-8")
    with pytest.raises(FedloraError, match=f"^{path}:3: 'prompt' is empty; "):
        load_file_corpus(str(path))
    path.write_text(content, encoding="utf-8")
    cell = tmp_path / "chat.csv"
    _csv(cell, ["messages"], [[json.dumps(CHATS[0])], ["not json"]])
    with pytest.raises(FedloraError, match=f"^{cell}:3: 'messages' is not JSON"):
        load_file_corpus(str(cell))
    with caplog.at_level("WARNING"):
        corpus = load_file_corpus(str(path), Columns(skip_bad_rows=True))
    assert _turns(corpus) == [
        (("user", "fine"), ("assistant", "ok")),
        (("user", "also fine"), ("assistant", "yes")),
    ]
    assert corpus.skipped == (f"{path}:4", f"{path}:3")  # the malformed record when read, then the bad row
    assert "skipped 2 bad rows of 4" in caplog.text


def test_a_file_whose_every_row_is_bad_is_one_line_even_when_skipping(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": ""}])
    with pytest.raises(FedloraError, match=r"bad.jsonl: every row was skipped \(1 bad row\)"):
        load_file_corpus(str(path), Columns(skip_bad_rows=True))


def test_the_options_are_declared_and_reach_the_reader_from_the_command_line():
    import argparse

    from common.runtime import columns_of
    from server.simulate_cli import add_config_arguments, config_from_args

    assert INSTRUCTION_FORMATS == instructions.CHOICES
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = ["--instruction-format", "prompt-completion", "--prompt-column", "q", "--response-column", "a"]
    cfg = config_from_args(parser.parse_args(args))
    assert columns_of(cfg) == Columns(instruction_format="prompt-completion", prompt="q", response="a")
    assert columns_of(config_from_args(parser.parse_args([]))) == Columns()
    with pytest.raises(FedloraError, match="unknown instruction-format 'json'; choose auto, chat, alpaca"):
        RunConfig(instruction_format="json").check()


def test_a_malformed_instruction_file_exits_2_in_one_line_before_any_model_loads(
    tmp_path, capsys, monkeypatch
):
    from common import runtime

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused dataset")

    monkeypatch.setattr(runtime, "load_model", no_model)
    path = _jsonl(tmp_path / "sft.jsonl", [*ALPACA, {"instruction": "Say hi.", "output": ""}])
    out = tmp_path / "run"
    argv = ["simulate", "--preset", "smollm2-rt", "--dataset", str(path), "--rounds", "1", "--workers", "1"]
    code = run_cli([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err == f"fedlora: error: {path}:4: 'output' is empty; {SKIP_HINT}"
    assert "Traceback" not in err and not out.exists()
