"""A data owner's instruction data: which form a file's rows take, and each row as a conversation
(issue 76).

Three forms, registered in :data:`FORMATS` (name -> :class:`InstructionFormat`: its columns and how a
row becomes a :data:`~common.data.conversation.Conversation`):

- ``alpaca``: ``instruction``, ``input`` (optional, may be empty) and ``output`` -> a user turn (the
  instruction, then a blank line and the input when there is one) and the assistant's output; an
  optional ``system`` column, when non-empty, opens the conversation with a system turn.
- ``prompt-completion``: ``prompt`` and ``completion`` -> one user turn and one assistant turn;
  ``--prompt-column`` / ``--response-column`` name other columns (and imply this form).
- ``chat``: ``messages``, a list of ``{"role", "content"}`` objects (or that list as JSON text, as
  a CSV cell holds it), the turns as given (:func:`common.data.conversation.problem` says what is
  wrong; a null key of a message, a Parquet struct's absent field, counts as absent).

``--instruction-format auto`` (the default) picks the form from a file's columns (:func:`reading`),
the first of :data:`FORMATS` in order whose columns the file has; a file with none of them is read
as before (classification or language modelling, common/data/files.py), as ``none`` always reads
it. Contents are kept as written; a required text must not be blank. A row that is not a
conversation gives its problem (one line, without the row's location: the reader adds it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from common.data.conversation import Conversation, problem
from common.errors import FedloraError

AUTO, NONE = "auto", "none"  # --instruction-format: pick the form by the columns / read as before
#: the options that rename a prompt-completion file's columns: canonical column -> option
RENAMING = {"prompt": "--prompt-column", "completion": "--response-column"}


class _RowProblem(ValueError):
    """Why a row is not a conversation (one line)."""


@dataclass(frozen=True)
class _Fields:
    """One row's values read by canonical column name (``names``: canonical -> the file's column)."""

    row: Mapping[str, object]
    names: Mapping[str, str]

    def text(self, key: str, required: bool = True) -> str:
        """The text in the column ``key`` names: ``""`` for an optional one that is absent (or
        null); raises :class:`_RowProblem` for a required one absent or blank, or a value that is
        not a string."""
        column = self.names[key]
        value = self.row.get(column)
        if value is None:
            if required:
                raise _RowProblem(f"no '{column}'")
            return ""
        if not isinstance(value, str):
            raise _RowProblem(f"'{column}' is {type(value).__name__} {_short(value)}, not text")
        if required and not value.strip():
            raise _RowProblem(f"'{column}' is empty")
        return value

    def value(self, key: str) -> object:
        """The raw value in the column ``key`` names; raises :class:`_RowProblem` when absent."""
        column = self.names[key]
        if self.row.get(column) is None:
            raise _RowProblem(f"no '{column}'")
        return self.row[column]


def _short(value: object) -> str:
    """``value`` as a short repr (at most 40 characters) for a one-line problem."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _alpaca(fields: _Fields) -> Conversation:
    """``instruction`` (+ a blank line and ``input`` when not blank) -> user, ``output`` ->
    assistant; a non-blank ``system`` opens the conversation."""
    instruction, extra = fields.text("instruction"), fields.text("input", required=False)
    output, system = fields.text("output"), fields.text("system", required=False)
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    opening = (("system", system),) if system.strip() else ()
    return (*opening, ("user", user), ("assistant", output))


def _prompt_completion(fields: _Fields) -> Conversation:
    """``prompt`` -> user, ``completion`` -> assistant."""
    return (("user", fields.text("prompt")), ("assistant", fields.text("completion")))


def _chat(fields: _Fields) -> Conversation:
    """``messages`` (a list of ``{role, content}``, or that list as JSON text) as its turns; a
    null key of a message (a Parquet struct's absent field) counts as absent."""
    column, turns = fields.names["messages"], fields.value("messages")
    if isinstance(turns, str):
        try:
            turns = json.loads(turns)
        except json.JSONDecodeError as exc:
            raise _RowProblem(f"'{column}' is not JSON ({exc.msg})") from None
    if isinstance(turns, list):
        turns = [{k: v for k, v in t.items() if v is not None} if isinstance(t, dict) else t for t in turns]
    if why := problem(turns):
        raise _RowProblem(f"'{column}': {why}")
    return tuple((t["role"], t["content"]) for t in turns)


@dataclass(frozen=True)
class InstructionFormat:
    """One form of instruction data: the columns a file of it must have (``required``; the first
    row's columns decide) and may have (``optional``), by canonical name; ``convert``, which turns
    a row's fields into a conversation (raising :class:`_RowProblem` for a bad row); and the
    columns of :data:`RENAMING` it has (``renamable``: naming one implies this form)."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    convert: Callable[[_Fields], Conversation]
    renamable: tuple[str, ...] = ()


#: the forms in the order ``auto`` tries them
FORMATS: dict[str, InstructionFormat] = {
    f.name: f
    for f in (
        InstructionFormat("chat", ("messages",), (), _chat),
        InstructionFormat("alpaca", ("instruction", "output"), ("input", "system"), _alpaca),
        InstructionFormat(
            "prompt-completion", ("prompt", "completion"), (), _prompt_completion, ("prompt", "completion")
        ),
    )
}
#: what --instruction-format takes
CHOICES = (AUTO, *FORMATS, NONE)


@dataclass(frozen=True)
class Reading:
    """How a file's rows become conversations: its form, and the file's column for each canonical
    column of the form (``names``)."""

    form: InstructionFormat
    names: Mapping[str, str]

    def conversation(self, row: Mapping[str, object]) -> Conversation | str:
        """The conversation of ``row`` (a dict of column values), or why it is not one (one line)."""
        try:
            return self.form.convert(_Fields(row, self.names))
        except _RowProblem as exc:
            return str(exc)


def reading(
    found: Sequence[str], chosen: str = AUTO, prompt: str = "", response: str = "", name: str = ""
) -> Reading | None:
    """How to read a file with the columns ``found`` as conversations, or None to read it as
    before (not instruction data). ``chosen``: the --instruction-format (one of :data:`CHOICES`);
    ``prompt``, ``response``: the file's columns that ``--prompt-column``, ``--response-column``
    name (``""``: none), which imply the form that has them; ``name``: the file, as errors name
    it. An unknown form, a renaming option with a form without its column, or a form (named, or
    implied by a renaming) whose columns the file lacks is a one-line FedloraError."""
    renames = {key: column for key, column in zip(RENAMING, (prompt, response), strict=True) if column}
    if chosen not in CHOICES:
        raise FedloraError(f"unknown instruction-format '{chosen}'; choose {', '.join(CHOICES)}")
    owners = [f for f in FORMATS.values() if set(renames) <= set(f.renamable)]
    if renames and chosen not in (AUTO, *(f.name for f in owners)):
        options = "/".join(RENAMING[k] for k in renames)
        verb = "names" if len(renames) == 1 else "name"
        whose = " or ".join(f.name for f in owners)
        raise FedloraError(
            f"{options} {verb} a {whose} file's columns: not with --instruction-format {chosen}"
        )
    form = _form(found, chosen, owners[0] if renames else None)
    if form is None:
        return None
    names = {key: renames.get(key, key) for key in (*form.required, *form.optional)}
    absent = [key for key in form.required if names[key] not in found]
    if absent:
        plain = [f"'{names[k]}'" for k in absent if k not in renames]
        named = [f"{RENAMING[k]} '{names[k]}'" for k in absent if k in renames]
        parts = ([f"{' or '.join(plain)} column"] if plain else []) + named
        target = f"{form.name} data" if chosen == AUTO else f"--instruction-format {chosen}"
        raise FedloraError(
            f"--dataset {name}: no {' or '.join(parts)} for {target} (columns: {', '.join(found)})"
        )
    return Reading(form, names)


def _form(found: Sequence[str], chosen: str, implied: InstructionFormat | None) -> InstructionFormat | None:
    """The form ``chosen`` names, or for ``auto`` the form a renaming option ``implied``, else the
    first of :data:`FORMATS` whose required columns are among ``found``; None: not instruction data."""
    if chosen == NONE:
        return None
    if chosen != AUTO:
        return FORMATS[chosen]
    return implied or next((f for f in FORMATS.values() if set(f.required) <= set(found)), None)


__all__ = ["CHOICES", "FORMATS", "InstructionFormat", "Reading", "reading"]
