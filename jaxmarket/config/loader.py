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
        value = safe_load(text, path.strip(), marks=False) if text.strip() else None
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
#: the most YAML nodes (scalars, lists, mappings) a document may reach through its
#: aliases, each alias counting every node it repeats: a config is a few thousand nodes,
#: its anchors repeat a few groups; "billion laughs" nests aliases to 9^9
MAX_EXPANDED_NODES = 10_000


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` for a user's config: an alias inside the node it names (a
    recursive alias, ``x: &a [*a]``) and aliases that repeat more than
    ``MAX_EXPANDED_NODES`` nodes in all are a :class:`ConfigError` naming ``where`` (a
    file, with the line and column; or an override's key), raised while the document is
    composed: nothing is expanded or constructed. Use :func:`safe_load`."""

    def __init__(self, stream: str, where: str, marks: bool = True):
        super().__init__(stream)
        self.config_where, self.config_marks = where, marks
        self.config_open: set[str] = set()     # the anchors of the nodes being composed
        self.config_sizes: dict[int, int] = {}  # a collection's size, its aliases expanded
        self.config_aliased = 0                 # the nodes reached through aliases so far

    def config_refuse(self, mark: Any, value: str, allowed: str) -> ConfigError:
        where = (f"{self.config_where}, line {mark.line + 1}, column {mark.column + 1}"
                 if self.config_marks and mark is not None else self.config_where)
        return ConfigError(where, value, allowed)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.config_open:
                raise self.config_refuse(
                    event.start_mark, f"a recursive alias *{event.anchor} (inside the node "
                    f"&{event.anchor} it names)", "aliases to nodes that end before the alias "
                    "(no node may contain itself)")
            node = super().compose_node(parent, index)
            self.config_aliased += self.config_sizes.get(id(node), 1)
            if self.config_aliased > MAX_EXPANDED_NODES:
                raise self.config_refuse(
                    event.start_mark, "YAML whose aliases expand to more than "
                    f"{MAX_EXPANDED_NODES:,} nodes", "a config whose aliases repeat at most "
                    f"{MAX_EXPANDED_NODES:,} values in all")
            return node
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.config_open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.config_open.discard(anchor)
        if isinstance(node, yaml.CollectionNode):
            children = (c for pair in node.value for c in pair) \
                if isinstance(node, yaml.MappingNode) else node.value
            self.config_sizes[id(node)] = 1 + sum(self.config_sizes.get(id(c), 1)
                                                  for c in children)
        return node


def safe_load(text: str, where: str, marks: bool = True) -> Any:
    """``yaml.safe_load(text)`` through :class:`ConfigLoader`: a recursive alias or an
    alias bomb is a :class:`ConfigError` naming ``where`` (``marks``: with the line and
    column); YAML errors are ``yaml.YAMLError`` as ``yaml.safe_load``'s."""
    loader = ConfigLoader(text, where, marks)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
        return safe_load(text, str(path)) or {}
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
    check_sections(config)
    return config


#: the top-level sections that are mappings, in the order the validation reads them, and
#: what each allows (the full validation's own words); None is an empty section, except
#: for market
SECTIONS = {
    "train": "a mapping of settings",
    "market": "a mapping with num_products, consumers, sellers, distributor",
    "learners": "a mapping from agent group name to learner config",
    "pbt": "a mapping of settings",
}


def check_sections(config: Mapping[str, Any]) -> None:
    """A :class:`ConfigError` naming the first top-level section of ``config`` that is
    not a mapping (``learners: [1, 2, 3]``, ``train: [1]``, ``market: 5``): checked as
    the config is loaded, before anything (the engine choice first) reads a section."""
    for key, allowed in SECTIONS.items():
        value = config.get(key)
        if key in config and not isinstance(value, Mapping) and (value is not None
                                                                 or key == "market"):
            raise ConfigError(key, value, allowed)
