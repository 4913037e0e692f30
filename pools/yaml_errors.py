"""Field-and-line errors for pdorch's YAML files (the fleet file, the SLO policy).

A YAML file is read twice: `yaml.compose` for the node tree (its marks give every key's line)
and `yaml.safe_load` for the data pydantic validates. A pydantic error's `loc` is mapped back
to the data path (dropping the tags pydantic adds for discriminated unions) and that path to
the line of the nearest key on it. Cross-field rules raise `FieldPathError(path, message)`
inside a validator so that their message names the field they are about, not the model.

One error per file: `ConfigFileError.issues` lists every problem; its message is one
`file:line: dotted.path: why` line per problem. `read_yaml` and `validate_config` are the two
steps every config loader takes (text → data and lines; data → model), each raising the
loader's own `ConfigFileError` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

FieldPath = tuple[str | int, ...]
LineMap = Mapping[FieldPath, int]
ModelT = TypeVar("ModelT", bound=BaseModel)


class FieldPathError(ValueError):
    """A cross-field rule failed at `path` (relative to the model whose validator raised it)."""

    def __init__(self, path: FieldPath, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config file: field path (`pools.decode.endpoints[1].url`), line, why."""

    path: str
    message: str
    line: int | None = None


class ConfigFileError(ValueError):
    """A config file is invalid; `issues` lists every problem, the message one per line."""

    default_source = "config"

    def __init__(self, issues: list[ConfigIssue], source: str | None = None) -> None:
        self.issues = issues
        self.source = source
        lines = []
        for issue in issues:
            where = source or self.default_source
            if issue.line is not None:
                where = f"{where}:{issue.line}"
            field = f"{issue.path}: " if issue.path else ""
            lines.append(f"{where}: {field}{issue.message}")
        super().__init__("\n".join(lines))


def dotted(path: FieldPath) -> str:
    """`("pools", "decode", "endpoints", 1, "url")` → `pools.decode.endpoints[1].url`.

    A key that would vanish or blur in the dotted form (empty, blank, or holding a dot) is
    quoted (`pools.""`): every issue must name its field (found by fuzzing).
    """
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = str(part)
        if not name.strip() or "." in name:
            name = '"' + name.replace('"', '\\"') + '"'
        out += f".{name}" if out else name
    return out


def data_path(loc: FieldPath, data: Any) -> FieldPath:
    """`loc` without the union tags pydantic adds (a launch spec's `sim`), by walking `data`."""
    path: list[str | int] = []
    node = data
    for part in loc:
        key: Any = part
        if (isinstance(node, dict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
        ):
            node = node[key]
            path.append(part)
        elif isinstance(node, dict) and node.get("kind") == part:
            continue  # the tag pydantic adds for a discriminated union (a launch kind)
        else:
            path.append(part)
            node = None
    return tuple(path)


def line_map(node: yaml.Node, path: FieldPath = ()) -> dict[FieldPath, int]:
    """1-based line of every mapping key and sequence item under `node`, by data path."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            lines[child] = key.start_mark.line + 1
            for sub, line in line_map(value, child).items():
                lines.setdefault(sub, line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            for sub, line in line_map(item, (*path, i)).items():
                lines.setdefault(sub, line)
    return lines


def line_of(path: FieldPath, lines: LineMap) -> int | None:
    """The line of `path`, or of its nearest ancestor the file has (a missing field's parent)."""
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None


def validation_issues(err: ValidationError, data: Any, lines: LineMap) -> list[ConfigIssue]:
    """One `ConfigIssue` per pydantic error, with the data path and its line."""
    issues = []
    for e in err.errors():
        loc: FieldPath = tuple(e["loc"])
        message = str(e["msg"]).removeprefix("Value error, ")
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldPathError):
            loc = (*loc, *cause.path)
            message = cause.message
        path = data_path(loc, data)
        issues.append(ConfigIssue(dotted(path), message, line_of(path, lines)))
    return issues


def parse_yaml(text: str) -> tuple[Any, dict[FieldPath, int]]:
    """The data and its line map; raises `yaml.YAMLError` (see `yaml_issue`)."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    data = yaml.safe_load(text)
    return data, (line_map(node) if node is not None else {})


def yaml_issue(err: yaml.YAMLError) -> ConfigIssue:
    """A YAML syntax error as an issue with its line."""
    mark = getattr(err, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(err, "problem", None) or str(err)
    return ConfigIssue("", f"YAML: {problem}", line)


def read_yaml(
    text: str, error: type[ConfigFileError], source: str | None = None
) -> tuple[Any, dict[FieldPath, int]]:
    """`parse_yaml`, a syntax error raised as `error` (with its line) instead of YAMLError."""
    try:
        return parse_yaml(text)
    except yaml.YAMLError as err:
        raise error([yaml_issue(err)], source) from None


def validate_config(
    model: type[ModelT],
    data: Any,
    error: type[ConfigFileError],
    *,
    base_dir: Path | None = None,
    source: str | None = None,
    lines: LineMap | None = None,
) -> ModelT:
    """`data` (`None`: all defaults) validated as `model`; `error` names every bad field (and
    its line, given `lines`). `base_dir` reaches the validators as `context["base_dir"]` (for
    the relative paths in a file)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(
            [ConfigIssue("", "expected a mapping at the top level", 1 if lines else None)], source
        )
    context = {"base_dir": base_dir} if base_dir is not None else None
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise error(validation_issues(err, data, lines or {}), source) from None
