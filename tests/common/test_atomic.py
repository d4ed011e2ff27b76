"""Atomic replacement (common/atomic.py): all of the new content or none of it."""

from __future__ import annotations

import stat

import pytest

from common.atomic import replacing, write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "ledger.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_the_new_content_replaces_the_old_and_a_secret_is_never_readable_by_others(tmp_path):
    target = tmp_path / "noise.safetensors"
    write_text(target, "old")
    with replacing(target, mode=0o600) as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600  # created private, before anything is written
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["noise.safetensors"]
