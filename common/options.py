"""Command-line options from the :class:`common.config.RunConfig` declarations: ``simulate``, the
benches and ``train-local`` take the same ``--name`` for the same option, with its declared help,
in its declared group."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import fields

from common.config import RunConfig

#: options that are not set from the command line this way (``--out``/``--resume`` are explicit)
_NOT_OPTIONS = ("out_dir", "resume")


def add_config_arguments(
    parser: argparse.ArgumentParser,
    only: Iterable[str] | None = None,
    defaults: Mapping[str, object] | None = None,
    required: Iterable[str] = (),
) -> None:
    """One ``--option`` per declared field (all but out-dir and resume, or those in ``only``),
    grouped as declared. Unset options parse to None (the preset's value), unless ``defaults``
    names a default for them."""
    chosen = set(only) if only is not None else None
    defaults, required = dict(defaults or {}), set(required)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(RunConfig):
        if f.name in _NOT_OPTIONS or (chosen is not None and f.name not in chosen):
            continue
        meta = f.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        group = groups[meta["group"]]
        kind = type(f.default)
        default = defaults.get(f.name)
        help_text = meta["help"] + ("" if default is None else f" (default {default})")
        name = f"--{f.name.replace('_', '-')}"
        if kind is bool:  # --flag / --no-flag
            group.add_argument(
                name, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
            continue
        group.add_argument(
            name,
            dest=f.name,
            type=kind,
            default=default,
            required=f.name in required,
            # choices are checked by RunConfig.check (one line, exit 2), not by argparse
            metavar="{" + ",".join(meta["choices"]) + "}" if meta["choices"] else kind.__name__.upper(),
            help=help_text,
        )


def config_values(args: argparse.Namespace) -> dict[str, object]:
    """The declared options given on the command line (or defaulted by the parser); None = unset."""
    return {f.name: getattr(args, f.name, None) for f in fields(RunConfig) if f.name not in _NOT_OPTIONS}


__all__ = ["add_config_arguments", "config_values"]
