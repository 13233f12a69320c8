"""YAML scenario files and dotted command-line overrides.

One file describes one scenario: ``market:`` (the economy), ``learners:`` (which
learner drives each agent group) and ``train:`` (the training loop), plus ``seed``.
Overrides are ``dotted.path=value`` strings; values are parsed as YAML
(``market.num_products=4``, ``market.sellers[0].count=3``, ``market.sellers.0.high=[1, 2]``).
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from jaxmarket.config.errors import ConfigError

TOP_LEVEL = ("market", "learners", "train", "seed", "name", "description", "pbt")
# the scenario files shipped with the package: a copy inside an installed wheel, a link to
# the repository's configs/ in a checkout (the checkout's configs/ itself where the link
# did not survive, e.g. a checkout without symlinks)
_PACKAGE = Path(__file__).resolve().parents[1]
SHIPPED_CONFIGS = next((d for d in (_PACKAGE / "configs", _PACKAGE.parent / "configs")
                        if d.is_dir()), _PACKAGE / "configs")
# the scenario train and check run without one (inside the package, so an installed
# wheel finds it too)
DEFAULT_CONFIG = SHIPPED_CONFIGS / "budget_monopoly.yaml"
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    pos = 0
    for m in _TOKEN.finditer(path):
        name, index = m.groups()
        parts.append(int(index) if index is not None else (int(name) if name.isdigit() else name))
        pos = m.end()
    if not parts or pos != len(path) or ".." in path:
        raise ConfigError("overrides", path, "a dotted path like market.sellers[0].count")
    return parts


def apply_override(config: dict, override: str) -> dict:
    """Set one ``dotted.path=value`` (value parsed as YAML) in ``config`` (in place)."""
    if "=" not in override:
        raise ConfigError("overrides", override, "KEY=VALUE with a dotted KEY, e.g. market.num_products=4")
    path, text = override.split("=", 1)
    try:
        if text.strip():
            check_expansion(yaml.compose(text), path.strip())
        value = yaml.safe_load(text) if text.strip() else None
    except (yaml.YAMLError, RecursionError):
        value = text
    except ConfigError:
        raise
    except ValueError:   # an integer past Python's int-to-string limit (4300 digits)
        raise ConfigError(path.strip(), f"a number of {len(text.strip())} characters",
                          "a number of at most 4300 digits") from None
    parts = _split_path(path.strip())
    node: Any = config
    where = ""
    for i, part in enumerate(parts[:-1]):
        where += f"[{part}]" if isinstance(part, int) else (("." if where else "") + part)
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                raise ConfigError(where, part, f"an index into a list of {len(node) if isinstance(node, list) else 0} items")
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigError(where, node, "a mapping to set keys in")
            node = node.setdefault(part, {} if not isinstance(parts[i + 1], int) else [])
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or not 0 <= last < len(node):
            raise ConfigError(path, last, "an index into an existing list")
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ConfigError(path, value, "a key inside a mapping")
        node[last] = value
    return config


def yaml_error(path: Path, err: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as a :class:`ConfigError` naming the file, line and column
    (1-based, as editors count), e.g. ``configs/x.yaml, line 3, column 9: got 'mapping
    values are not allowed here'; allowed: valid YAML``."""
    mark = getattr(err, "problem_mark", None)
    where = str(path) if mark is None else f"{path}, line {mark.line + 1}, column {mark.column + 1}"
    problem = getattr(err, "problem", None) or str(err).replace("\n", " ")
    context = getattr(err, "context", None)
    text = f"{problem} ({context})" if context else problem
    return ConfigError(where, text, "valid YAML")


# a scenario file is a few kilobytes; anything past this is not one (and would only make
# the parser slow): refused before it is read
MAX_CONFIG_BYTES = 1 << 20
#: the most YAML nodes (scalars, lists, mappings) a document may hold once its aliases
#: are expanded: a config is a few thousand; "billion laughs" nests aliases to 9^9
MAX_EXPANDED_NODES = 1_000_000


def check_expansion(root: Any, where: str) -> None:
    """A :class:`ConfigError` when the YAML node graph ``root`` (``yaml.compose``: aliases
    are shared nodes, nothing expanded) would hold more than ``MAX_EXPANDED_NODES``
    nodes once its aliases are expanded; counted on the graph, each shared node once."""
    sizes: dict[int, int] = {}
    stack = [(root, False)] if root is not None else []
    while stack:   # post-order over the graph, a node's size once its children's are
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        children = ([c for pair in node.value for c in pair]
                    if isinstance(node, yaml.MappingNode) else
                    list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[id(node)] = min(1 + sum(sizes.get(id(c), 1) for c in children),
                              MAX_EXPANDED_NODES + 1)
    total = sizes.get(id(root), 0)
    if total > MAX_EXPANDED_NODES:
        raise ConfigError(where, "YAML whose aliases expand to more than "
                          f"{MAX_EXPANDED_NODES:,} nodes", "a config of at most "
                          f"{MAX_EXPANDED_NODES:,} values once aliases are expanded")


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path``; a file that is not UTF-8 text (binary, Latin-1),
    not YAML, nested past Python's recursion limit or over ``MAX_CONFIG_BYTES`` is a
    :class:`ConfigError` naming the file."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(str(path), f"{size} bytes", f"a YAML file of at most "
                          f"{MAX_CONFIG_BYTES} bytes")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), f"byte {data[err.start]:#04x} at offset {err.start}",
                          "a UTF-8 text file (YAML)") from None
    if "\x00" in text:
        raise ConfigError(str(path), "a NUL byte", "a UTF-8 text file (YAML)")
    try:
        check_expansion(yaml.compose(text), str(path))
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise yaml_error(path, err) from None
    except RecursionError:
        raise ConfigError(str(path), "nesting deeper than Python's recursion limit",
                          "valid YAML of reasonable depth") from None
    except ConfigError:
        raise
    except ValueError:   # an integer past Python's int-to-string limit (4300 digits)
        raise ConfigError(str(path), "a number of more than 4300 digits",
                          "numbers of at most 4300 digits") from None


# configs renamed, by their old file name: the old name still loads the new file, with
# one line on stderr naming it (for one release)
RENAMED = {"legacy_default.yaml": "budget_monopoly.yaml"}


def renamed(path: Path) -> Path:
    """``path`` itself, or the new file of a renamed config (``configs/legacy_default.yaml``
    -> ``configs/budget_monopoly.yaml``, beside it or in the shipped configs) with a
    deprecation line on stderr."""
    if path.exists() or path.name not in RENAMED:
        return path
    new = path.with_name(RENAMED[path.name])
    if not new.exists() and (SHIPPED_CONFIGS / new.name).is_file() and \
            (not path.is_absolute() or path.parent.name == "configs"):
        new = SHIPPED_CONFIGS / new.name
    if not new.is_file():
        return path
    print(f"DeprecationWarning: {path} is renamed {new} (the old name is removed in the next "
          "release)", file=sys.stderr)
    return new


def shipped_path(source: str | Path) -> Path:
    """``source`` as a path; a relative ``configs/NAME.yaml`` that does not exist from
    the working directory (outside a checkout: an installed wheel, a notebook) is the
    shipped file of that name, so the paths in the docs work everywhere; a renamed
    config's old name is its new file (:func:`renamed`)."""
    path = renamed(Path(source))
    if (not path.exists() and not path.is_absolute() and len(path.parts) == 2
            and path.parts[0] == "configs" and (SHIPPED_CONFIGS / path.name).is_file()):
        return SHIPPED_CONFIGS / path.name
    return path


def load_config(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> dict:
    """Read a scenario (a YAML path or a mapping), apply overrides, check top-level keys.

    Deep validation happens in :func:`jaxmarket.market.spec.resolve_market` and the
    learner/train resolvers; all raise :class:`ConfigError` before anything compiles.
    """
    if isinstance(source, Mapping):
        config = copy.deepcopy(dict(source))
    else:
        path = shipped_path(source)
        if not path.is_file():
            raise ConfigError("config", str(source), "an existing YAML file")
        config = read_yaml(path)
    if not isinstance(config, dict):
        raise ConfigError("config", config, "a YAML mapping with a market: section")
    for item in overrides:
        apply_override(config, item)
    for key in config:
        if key not in TOP_LEVEL:
            raise ConfigError(str(key), config[key], "top-level keys are " + ", ".join(TOP_LEVEL))
    if "market" not in config:
        raise ConfigError("market", "<missing>", "a market: section (this field is required)")
    return config
