"""Typed frozen dataclasses from TOML: checked values, ``--set`` overrides, and errors that
name the offending key (``section.key``), never a silently ignored one.

:mod:`adaqp.config` defines the sections; this module knows only how to fill any tree of
dataclasses whose fields are bool, int, float, str, tuples of those, or nested sections.
A config file that is not there is refused with the configs a user could have meant
(``adaqp.cli.configs.missing_config``, which the launcher says alike).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from adaqp.cli.configs import missing_config


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


def check(condition: bool, key: str, message: str) -> None:
    """Raises ``ConfigError("key: message")`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _Override(str):
    """Text from ``--set``: parsed by the field's type (a TOML string is never parsed)."""


def _coerce(value: Any, kind: Any, key: str) -> Any:
    """Checks a TOML value (or parses an override string) against a field's type."""
    if isinstance(value, _Override):
        value = str(value) if kind is str else _parse_scalar(value, kind, key)
    if kind is bool:
        check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
    elif kind is int:
        check(
            isinstance(value, int) and not isinstance(value, bool),
            key,
            f"expected an integer, got {value!r}",
        )
    elif kind is float:
        check(
            isinstance(value, int | float) and not isinstance(value, bool),
            key,
            f"expected a number, got {value!r}",
        )
        value = float(value)
        check(math.isfinite(value), key, f"must be a finite number, got {value!r}")
    elif kind is str:
        check(isinstance(value, str), key, f"expected a string, got {value!r}")
    elif isinstance(kind, types.GenericAlias) and kind.__origin__ is tuple:
        check(isinstance(value, list | tuple), key, f"expected a list, got {value!r}")
        item = kind.__args__[0]
        value = tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    else:  # pragma: no cover - a field type this loader does not know is a bug here
        raise TypeError(f"{key}: unsupported field type {kind!r}")
    return value


def _parse_scalar(text: str, kind: Any, key: str) -> Any:
    if kind is bool:
        lowered = text.strip().lower()
        check(lowered in ("true", "false", "1", "0"), key, f"expected true or false, got {text!r}")
        return lowered in ("true", "1")
    if isinstance(kind, types.GenericAlias) and kind.__origin__ is tuple:
        text = text if text.lstrip().startswith("[") else f"[{text}]"
    try:
        parsed = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        name = getattr(kind, "__name__", str(kind))
        raise ConfigError(f"{key}: cannot parse {text!r} as {name}") from None
    return parsed


def build(
    cls: type, values: dict[str, Any], prefix: str, renamed: dict[str, str] | None = None
) -> Any:
    """``cls`` filled from ``values`` (a TOML tree), every key checked. ``renamed`` maps a
    key's old dotted name to its new one: the old name is refused with the new one, never
    read as it (a value written for the old name may not mean what the new one does)."""
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in names:
            if renamed and path in renamed:
                raise ConfigError(f"{path}: renamed to {renamed[path]}; write that key instead")
            known = ", ".join(sorted(names))
            raise ConfigError(f"{path}: unknown key (known keys here: {known})")
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            check(isinstance(value, dict), path, "expected a table of keys")
            kwargs[key] = build(kind, value, f"{path}.", renamed)
        else:
            kwargs[key] = _coerce(value, kind, path)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:  # sections defined elsewhere raise plain ValueError
        raise ConfigError(f"{prefix.rstrip('.')}: {exc}") from None


def _set_path(tree: dict[str, Any], dotted: str, value: str) -> None:
    parts = dotted.split(".")
    check(len(parts) >= 2 and all(parts), dotted, "overrides look like section.key=value")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        check(isinstance(child, dict), dotted, f"{part} is not a section")
        node = child
    node[parts[-1]] = value


def read_tree(path: str | Path | None, overrides: list[str] | None) -> dict[str, Any]:
    """The TOML file's tree (none: empty) with ``section.key=value`` overrides applied.

    Raises:
        ConfigError: a missing file, bad TOML, or an override that is not ``key=value``.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(missing_config(path))
        try:
            tree = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (TOML): {exc}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for item in overrides or []:
        key, sep, value = item.partition("=")
        check(bool(sep), item, "overrides look like section.key=value")
        _set_path(tree, key.strip(), _Override(value.strip()))
    return tree
