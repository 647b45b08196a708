"""Shared pieces of the command-line entry points: refusal of bad arguments with one line and exit 2."""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["Parser", "integer", "number", "add_version", "version"]


def version() -> str:
    """The installed package's version (pyproject.toml's, through the package metadata)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("cais")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: the program's name and the package's version, exit 0."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}")


class Parser(argparse.ArgumentParser):
    """argparse that refuses a bad argument with one line (no usage dump, no traceback) and exit status 2."""

    def error(self, message):  # noqa: D102 (argparse API)
        self.exit(2, f"{self.prog}: error: {message}\n")


def integer(low: int | None = None) -> Callable[[str], int]:
    """An argument type: an integer (decimal, 0x.., 0b..), at least `low` when given."""
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{text} must be at least {low}")
        return value
    parse.__name__ = "integer"
    return parse


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def boolean(text: str) -> bool:
    """An argument type: true/false (also yes/no, on/off, 1/0; any case)."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false, yes/no, on/off, 1/0)")


def number(low: float, high: float, *, include_low: bool = True) -> Callable[[str], float]:
    """An argument type: a number in [low, high) ((low, high) without `include_low`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not ((low <= value if include_low else low < value) and value < high):
            raise argparse.ArgumentTypeError(f"{text} must be in {'[' if include_low else '('}{low}, {high})")
        return value
    parse.__name__ = "number"
    return parse


def add_param_arguments(parser: argparse.ArgumentParser, title: str = "switch parameters (cais.params.SwitchParams)"):
    """One option per field of :class:`cais.params.SwitchParams` (``--ports N``, ``--float-units BOOL``, ...),
    defaulting to the field's default. :func:`params_from_args` builds the parameters back."""
    from dataclasses import fields

    from .params import SwitchParams

    defaults = SwitchParams()
    group = parser.add_argument_group(title)
    for f in fields(SwitchParams):
        default = getattr(defaults, f.name)
        flag = isinstance(default, bool)
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=boolean if flag else integer(),
                           default=default, metavar="BOOL" if flag else "N",
                           help=f"default {str(default).lower() if flag else default}")


def params_from_args(parser: argparse.ArgumentParser, args):
    """The :class:`cais.params.SwitchParams` of parsed options; a set the switch cannot be built with is
    refused through ``parser.error`` (one line, exit status 2)."""
    from dataclasses import fields

    from .params import ParamError, SwitchParams

    try:
        return SwitchParams(**{f.name: getattr(args, f.name) for f in fields(SwitchParams)})
    except ParamError as exc:
        parser.error(str(exc))
