"""A conversation: the unit of instruction and chat data (issue 76).

Every form a data owner's instruction file takes (alpaca-style ``instruction``/``input``/``output``,
``prompt``/``completion``, or chat ``messages``: common/data/instructions.py) becomes a sequence of
``(role, content)`` turns, roles from :data:`ROLES`, opening (after any ``system`` turn) with the
``user``'s, with at least one non-empty ``assistant`` turn (the turns a model learns to produce:
the training loss covers them alone, common/tasks/chat.py).

A :class:`~common.data.corpora.Corpus` of task :data:`TASK` holds each conversation in ``texts`` as
its canonical JSON (:func:`dumps`: a list of ``{"role", "content"}`` objects, no whitespace), so that
splitting, partitioning by user, deduplication and the held-out split treat a conversation as the
text it is.
"""

from __future__ import annotations

import json

TASK = "chat"  # the corpus task of conversations
MC_TASK = "multiple-choice"  # conversations that are multiple-choice items (common/data/multiple_choice.py)
TASKS = (TASK, MC_TASK)  # the corpus tasks whose texts are conversations
ROLES = ("system", "user", "assistant")
RESPONSE_ROLE = "assistant"

#: a conversation: ``(role, content)`` turns in order
Conversation = tuple[tuple[str, str], ...]


def problem(turns: object) -> str:
    """Why ``turns`` (parsed JSON: a list of ``{"role", "content"}``) is not a conversation, or ``""``."""
    if not isinstance(turns, list) or not turns:
        return "a conversation is a non-empty list of {role, content} messages"
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or set(turn) - {"role", "content"} or "role" not in turn:
            return f"message {k + 1} is not an object with role and content"
        if turn["role"] not in ROLES:
            return f"message {k + 1} has role {turn['role']!r}; roles are {', '.join(ROLES)}"
        if not isinstance(turn.get("content"), str):
            return f"message {k + 1} has no text content"
    opening = next((t["role"] for t in turns if t["role"] != "system"), "")
    if opening != "user":
        return "the first message after any system message must be the user's (an answer needs a prompt)"
    if not any(t["role"] == RESPONSE_ROLE and t["content"].strip() for t in turns):
        return f"no non-empty {RESPONSE_ROLE} message: nothing to learn from"
    return ""


def dumps(conversation: Conversation) -> str:
    """The canonical JSON of ``conversation`` (what a chat corpus keeps in ``texts``)."""
    return json.dumps(
        [{"role": role, "content": content} for role, content in conversation],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def loads(text: str) -> Conversation:
    """The conversation :func:`dumps` wrote; a ValueError (one line) for anything else."""
    turns = json.loads(text)
    if why := problem(turns):
        raise ValueError(why)
    return tuple((t["role"], t["content"]) for t in turns)


__all__ = ["MC_TASK", "RESPONSE_ROLE", "ROLES", "TASK", "TASKS", "Conversation", "dumps", "loads", "problem"]
