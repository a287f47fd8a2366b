"""Config files: JSON (read as hjson, as DeepSpeed does) and YAML, within bounds.

DeepSpeed reads its config with hjson, so users' JSON files carry comments and trailing commas;
they load here too. On top of the parsers: a key given twice in one mapping is an error (a
later value would silently win), and a file cannot make the reader spend unbounded time or
memory. A YAML alias repeats a whole subtree by reference, so a few hundred bytes of nested
aliases ("billion laughs") expand to billions of values; nesting deeper than the interpreter's
stack, integers of thousands of digits and mappings that contain themselves would otherwise
end in a traceback. Each is refused with a ConfigError naming the file (and line, where the
parser knows it).

The bounds are far above any real config: DeepSpeed configs are a few levels deep and a few
hundred values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Iterator
from typing import Any

from .values import ConfigError

__all__ = ["MAX_DEPTH", "MAX_INT_BITS", "MAX_VALUES", "plain", "read_file"]

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists accepted."""
MAX_VALUES = 100_000
"""Most values a config may hold once YAML aliases are expanded."""
MAX_INT_BITS = 64
"""Largest integer accepted (sizes, counts and steps all fit)."""


class _DupDict(dict):
    """A parsed mapping that remembers keys given more than once (and where, for YAML)."""

    duplicates: list[tuple[Any, str]]


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    result = _DupDict()
    result.duplicates = []
    for key, value in pairs:
        if key in result:
            result.duplicates.append((key, ""))
        result[key] = value
    return result


# ---------------------------------------------------------------------------------------------
# Bounds, checked over the parsed values before anything copies them.


def _child_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


class _BoundsWalk:
    """Checks depth, expanded size and self-reference, and finds the first duplicate key.

    Sizes are memoised by identity, so a subtree shared through aliases is walked once while
    counted as often as it appears: the walk costs the file's size, never the expansion's.
    """

    def __init__(self, origin: str | None):
        self.origin = origin
        self.sizes: dict[int, int] = {}
        self.open_ids: set[int] = set()
        self.first_duplicate: tuple[str, str] | None = None

    def refuse(self, problem: str, path: str) -> ConfigError:
        return ConfigError(problem, path or None, self.origin)

    def visit(self, value: Any, path: str, depth: int) -> int:
        """The number of values in `value` once aliases are expanded (itself included)."""
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            # Such an int means nothing as a setting, and str()/json of it fails past 4300
            # digits (the run record writes the config as JSON).
            raise self.refuse(
                f"is an integer of {value.bit_length()} bits; config values fit in "
                f"{MAX_INT_BITS} bits",
                path,
            )
        if not isinstance(value, (dict, list)):
            return 1
        known = self.sizes.get(id(value))
        if known is not None:
            return known
        if id(value) in self.open_ids:
            raise self.refuse(
                "contains itself (a YAML alias to an enclosing node); write the values out", path
            )
        if depth > MAX_DEPTH:
            raise self.refuse(
                f"is nested more than {MAX_DEPTH} levels deep; a config is a few levels deep", path
            )
        self.open_ids.add(id(value))
        total = 1
        for item_path, item in self.children(value, path):
            total += self.visit(item, item_path, depth + 1)
            if total > MAX_VALUES:
                raise self.refuse(
                    f"holds more than {MAX_VALUES} values once YAML aliases are expanded; "
                    "a config needs a few hundred (write the values out instead of nesting "
                    "aliases)",
                    path,
                )
        self.open_ids.discard(id(value))
        self.sizes[id(value)] = total
        return total

    def children(self, value: dict | list, path: str) -> Iterator[tuple[str, Any]]:
        """(key path, value) of each entry; notes the first duplicate key met."""
        if isinstance(value, list):
            return ((f"{path}[{i}]", item) for i, item in enumerate(value))
        if isinstance(value, _DupDict) and value.duplicates and self.first_duplicate is None:
            key, where = value.duplicates[0]
            self.first_duplicate = (_child_path(path, key), where)
        return ((_child_path(path, key), item) for key, item in value.items())


def _walk(data: Any, origin: str | None) -> tuple[str, str] | None:
    """Check the bounds of `data`; return the first duplicate key (path, where) if any."""
    walk = _BoundsWalk(origin)
    walk.visit(data, "", 0)
    return walk.first_duplicate


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def plain(data: Any, origin: str | None) -> Any:
    """Plain dicts and lists (no duplicate tracking, no shared subtrees), within the bounds."""
    found = _walk(data, origin)
    if found:
        key, where = found
        at = f" ({where})" if where else ""
        raise ConfigError(
            f"is given more than once{at}; a later value would silently replace an earlier one, "
            "so keep exactly one",
            key,
            origin,
        )
    return _copy(data)


# ---------------------------------------------------------------------------------------------
# Parsers.


def _parse_hjson(text: str, origin: str) -> Any:
    import hjson  # pure Python; only needed when a file is read

    try:
        return hjson.loads(text, object_pairs_hook=_pairs)
    except hjson.HjsonDecodeError as err:
        raise ConfigError(
            f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}", origin=origin
        ) from None
    except RecursionError:
        raise ConfigError(
            f"is nested too deeply to read; a config is a few levels deep (at most {MAX_DEPTH})",
            origin=origin,
        ) from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise ConfigError(f"invalid JSON: {_first_line(err)}", origin=origin) from None


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__


def _yaml_loader() -> type:
    import yaml  # only needed for YAML files

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that records duplicate keys, refuses keys that are not names, and reads
        5e8 / 1e-3 as numbers.

        PyYAML (YAML 1.1) reads `lr: 1e-3` as the string "1e-3"; YAML 1.2 and every JSON user
        expect a float.

        Nesting is bounded while scanning: a 10 KB file of brackets would otherwise be parsed
        thousands of levels deep before anything could refuse it.
        """

        def _refuse_deep_nesting(self) -> None:
            # The open block collections (the top one included) and flow brackets: the depth
            # `_check_nodes` counts, with the top collection at 0.
            if len(self.indents) - 1 + self.flow_level > MAX_DEPTH:
                raise ConfigError(
                    f"line {self.line + 1}: nested more than {MAX_DEPTH} levels deep; a config "
                    "is a few levels deep"
                )

        def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's
            super().fetch_flow_collection_start(TokenClass)
            self._refuse_deep_nesting()

        def add_indent(self, column: int) -> bool:
            opened = super().add_indent(column)
            self._refuse_deep_nesting()
            return opened

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict:
        seen: set[Any] = set()
        duplicates = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            line = f"line {key_node.start_mark.line + 1}"
            if not isinstance(key, Hashable) or isinstance(key, (tuple, frozenset)):
                kind = "list" if isinstance(key, (list, tuple)) else "mapping"
                raise ConfigError(f"a mapping key must be a name, not a {kind} ({line})")
            if key in seen:
                duplicates.append((key, line))
            seen.add(key)
        loader.flatten_mapping(node)
        result = _DupDict(loader.construct_pairs(node, deep=deep))
        result.duplicates = duplicates
        return result

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return StrictLoader


def _check_nodes(root: Any, origin: str) -> None:
    """Bound the composed YAML graph before anything is built from it: merge keys (`<<`)
    copy whole mappings while building, so the expansion must be bounded first."""
    import yaml

    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def visit(node: Any, depth: int) -> int:
        if isinstance(node, yaml.ScalarNode):
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        line = node.start_mark.line + 1
        if id(node) in open_ids:
            raise ConfigError(
                f"line {line}: an alias refers to a node that contains it; write the values out",
                origin=origin,
            )
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"line {line}: nested more than {MAX_DEPTH} levels deep; a config is a few "
                "levels deep",
                origin=origin,
            )
        open_ids.add(id(node))
        total = 1
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        for child in children:
            total += visit(child, depth + 1)
            if total > MAX_VALUES:
                raise ConfigError(
                    f"line {line}: holds more than {MAX_VALUES} values once aliases are "
                    "expanded; a config needs a few hundred (write the values out instead of "
                    "nesting aliases)",
                    origin=origin,
                )
        open_ids.discard(id(node))
        sizes[id(node)] = total
        return total

    if root is not None:
        visit(root, 0)


def _parse_yaml(text: str, origin: str) -> Any:
    import yaml

    loader = None
    try:
        loader = _yaml_loader()(text)  # reads the stream: a bad character fails here
        root = loader.get_single_node()
        _check_nodes(root, origin)
        return loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or _first_line(err)
        raise ConfigError(f"invalid YAML{where}: {problem}", origin=origin) from None
    except ConfigError as err:
        raise err.from_file(origin) from None
    except RecursionError:
        raise ConfigError(
            f"is nested too deeply to read; a config is a few levels deep (at most {MAX_DEPTH})",
            origin=origin,
        ) from None
    except ValueError as err:  # an integer of more than 4300 digits, a bad timestamp
        raise ConfigError(f"invalid YAML: {_first_line(err)}", origin=origin) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_file(path: str | os.PathLike, origin: str) -> Any:
    """The plain data of a .json (hjson) or .yaml/.yml config file."""
    try:
        with open(path, encoding="utf-8-sig") as handle:  # a BOM is not an error
            text = handle.read()
    except FileNotFoundError:
        raise ConfigError("no such file; check the path", origin=origin) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", origin=origin) from None
    except OSError as err:
        raise ConfigError(f"cannot be read: {err.strerror}", origin=origin) from None
    except UnicodeDecodeError:
        raise ConfigError("is not UTF-8 text; is it a JSON or YAML file?", origin=origin) from None
    if str(path).lower().endswith((".yaml", ".yml")):
        data = _parse_yaml(text, origin)
    else:
        data = _parse_hjson(text, origin)
    return plain(data, origin)
