"""Which keys a mapping of the config may hold: one check for the top level and every block.

DeepSpeed ignores keys it does not know; a misspelt "gradient_clipping" would then train
without clipping. Here an unknown key is an error that names its path and the nearest valid
key (or, when none is close, the fix), and a DeepSpeed key this runtime does not model is
accepted only while its check in runtime.config.features lets it through.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from .features import Check
from .values import ConfigError, did_you_mean

__all__ = ["Setting", "check_keys"]


class Setting(NamedTuple):
    """One key of a mapping that sets a field of the schema."""

    key: str
    """The key as the user wrote it (an alias, perhaps)."""
    field: str
    """The schema field it sets."""
    value: Any


def check_keys(
    where: str | None,
    mapping: Mapping[str, Any],
    fields: Collection[str],
    accepted: Mapping[str, Check] = {},  # noqa: B006 - read only
    aliases: Mapping[str, str] = {},  # noqa: B006 - read only
    *,
    unknown: str = "is not a valid key",
    otherwise: str | None = None,
) -> list[Setting]:
    """The settings of `mapping` (found at key path `where`; None for the top level).

    A key is a field, an alias of one (`aliases`: other spelling -> field), or a key of
    `accepted`, whose check returns None or the reason it is refused. Anything else raises
    ConfigError "<path> <unknown>; did you mean '<nearest>'?", or, with nothing close,
    "<path> <unknown>; <otherwise>" (default: the list of fields).
    """
    settings = []
    for key, value in mapping.items():
        path = f"{where}.{key}" if where else str(key)
        field = aliases.get(key, key)
        if field in fields:
            if field != key and field in mapping:
                raise ConfigError(f"and {where}.{field} both set the same option; keep one", path)
            settings.append(Setting(key, field, value))
        elif key in accepted:
            refusal = accepted[key](value)
            if refusal:
                raise ConfigError(refusal, path)
        else:
            hint = did_you_mean(str(key), {*fields, *accepted, *aliases})
            fix = hint or otherwise or "valid keys: " + ", ".join(sorted(fields))
            raise ConfigError(f"{unknown}; {fix}", path)
    return settings
