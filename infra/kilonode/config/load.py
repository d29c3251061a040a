"""Load a stack file, validate it once, and report every problem with file, line and field.

The stack file is a Pulumi stack config file (`stacks/Pulumi.<stack>.yaml`); kilonode reads
the structured value under `kilonode:cluster`. Problems are collected, never thrown one at a
time: a user fixing a stack sees everything wrong in one run.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from kilonode.config.checks import cross_field_problems
from kilonode.config.model import ClusterConfig
from kilonode.config.sysctl_profile import SysctlProfile
from kilonode.paths import EXAMPLE_STACKS_DIR, SYSCTL_DIR
from kilonode.problems import Loc, PlanError, Problem, StackError

CONFIG_KEY = "kilonode:cluster"


@dataclass(frozen=True)
class Stack:
    """A validated stack: its name, where it came from, its config and sysctl profile."""

    name: str
    file: Path
    config: ClusterConfig
    sysctl_profile: SysctlProfile
    raw: dict[str, Any]  # the `kilonode:cluster` value as the file holds it (what Pulumi's config reads)


def project_root(start: Path | None = None) -> Path | None:
    """The nearest directory at or above `start` (default: the working directory) holding a
    Pulumi.yaml: the Pulumi project whose stacks STACK names refer to."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "Pulumi.yaml").is_file()), None)


def project_stacks_dir(start: Path | None = None) -> Path | None:
    """The project's stack files: its Pulumi.yaml's `stackConfigDir`, else the project folder."""
    root = project_root(start)
    if root is None:
        return None
    try:
        project = yaml.safe_load((root / "Pulumi.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        project = {}
    sub = project.get("stackConfigDir") if isinstance(project, dict) else None
    return root / sub if isinstance(sub, str) else root


def stack_dirs(stacks_dir: Path | None = None) -> list[Path]:
    """Where STACK names are looked up, in order: the given folder, or the current project's
    stacks, then the example stacks kilonode ships (local, research-2500, research-7500)."""
    if stacks_dir is not None:
        return [stacks_dir]
    dirs = [d for d in (project_stacks_dir(), EXAMPLE_STACKS_DIR) if d is not None]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def stack_file(ref: str, stacks_dir: Path | None = None) -> Path:
    """A stack name (see stack_dirs) or a path to a stack file."""
    candidate = Path(ref)
    if candidate.suffix in {".yaml", ".yml"} or "/" in ref:
        if candidate.is_file():
            return candidate
        if candidate.is_dir():
            raise StackError(ref, [Problem((), "is a directory, not a stack file")])
        raise StackError(ref, [Problem((), "no such stack file")])
    dirs = stack_dirs(stacks_dir)
    for folder in dirs:
        named = folder / f"Pulumi.{ref}.yaml"
        if named.is_file():
            return named
    where = "; ".join(f"{display_path(d)}: {', '.join(available_stacks(d)) or 'none'}" for d in dirs)
    raise StackError(ref, [Problem((), f"no stack named {ref!r} (looked in {where}); give a stack name from "
                                       "there or a path to a stack file")])


def available_stacks(stacks_dir: Path = EXAMPLE_STACKS_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))


def stack_name_of(file: Path) -> str:
    name = file.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")):
        return name[len("Pulumi."):].rsplit(".", 1)[0]
    return file.stem


def load_stack(ref: str, stacks_dir: Path | None = None, sysctl_dir: Path = SYSCTL_DIR) -> Stack:
    """Load and validate a stack file; raise StackError listing every problem."""
    file = stack_file(ref, stacks_dir)
    text = read_text(file)
    try:
        document = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else None
        message = f"not valid YAML: {getattr(err, 'problem', err)}"
        raise StackError(display_path(file), [Problem((), message, line)]) from None
    raw, problems = _cluster_value(document)
    return _validated(stack_name_of(file), file, raw, problems, sysctl_dir)


def read_text(file: Path) -> str:
    """The stack file's text, or a StackError saying why it cannot be read."""
    try:
        data = file.read_bytes()
    except IsADirectoryError:
        raise StackError(display_path(file), [Problem((), "is a directory, not a stack file")]) from None
    except OSError as error:
        why = f"cannot read the stack file: {error.strerror or error}; check that it exists and is readable"
        raise StackError(display_path(file), [Problem((), why)]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise StackError(display_path(file), [Problem(
            (), f"byte 0x{data[error.start]:02x} at column {column} is not UTF-8; save the file as UTF-8",
            line)]) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one map (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first given on line {seen[key]}); YAML would silently keep "
                    "only the last one: remove one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def stack_from_value(name: str, raw: Any, file: Path, sysctl_dir: Path = SYSCTL_DIR) -> Stack:
    """Validate a `kilonode:cluster` value already read by someone else (the Pulumi
    program reads it with pulumi.Config); `file` is where it came from, for messages."""
    problems: list[Problem] = []
    if not isinstance(raw, dict):
        problems.append(Problem((), f"'{CONFIG_KEY}' must be a map (at least name and nodePools)"))
        raw = None
    return _validated(name, file, raw, problems, sysctl_dir)


def _validated(
    name: str, file: Path, raw: dict[str, Any] | None, problems: list[Problem], sysctl_dir: Path
) -> Stack:
    config: ClusterConfig | None = None
    if raw is not None:
        try:
            # the documented camelCase keys only: `gpus_per_node` is a typo here, not an alias
            config = ClusterConfig.model_validate(raw, by_alias=True, by_name=False)
        except ValidationError as err:
            problems += _from_pydantic_errors(err.errors())
    profile: SysctlProfile | None = None
    if config is not None:
        profile, profile_problems = _load_profile(config.sysctl.profile, sysctl_dir)
        problems += profile_problems
    if config is not None and profile is not None:
        problems += cross_field_problems(config, profile)
    if problems or config is None or profile is None:
        raise StackError(display_path(file), _with_lines(problems, _compose(file)))
    return Stack(name, file, config, profile, raw or {})


def _compose(file: Path) -> yaml.Node | None:
    try:
        return yaml.compose(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def with_lines(stack: Stack, error: PlanError) -> StackError:
    """Turn a planner's problems into a StackError pointing into the stack file."""
    return StackError(display_path(stack.file), _with_lines(error.problems, _compose(stack.file)))


def display_path(file: Path) -> str:
    """The path as a user would type it: relative to the working directory when inside it."""
    try:
        return str(file.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def _cluster_value(document: Any) -> tuple[dict[str, Any] | None, list[Problem]]:
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        return None, [Problem((), f"a stack file needs a top-level 'config:' map holding '{CONFIG_KEY}:'")]
    config = document["config"]
    problems = [
        Problem((key,), f"unknown kilonode setting; everything goes under '{CONFIG_KEY}'")
        for key in config
        if isinstance(key, str) and key.startswith("kilonode:") and key != CONFIG_KEY
    ]
    raw = config.get(CONFIG_KEY)
    if not isinstance(raw, dict):
        problems.append(Problem((), f"'config:' needs a '{CONFIG_KEY}:' map (at least name and nodePools)"))
        return None, problems
    return raw, problems


def _load_profile(name: str, sysctl_dir: Path) -> tuple[SysctlProfile | None, list[Problem]]:
    path = sysctl_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in sysctl_dir.glob("*.yaml")))
        return None, [Problem(("sysctl", "profile"), f"no profile {name!r} in {sysctl_dir}; known: {known}")]
    try:
        return SysctlProfile.model_validate(yaml.safe_load(path.read_text())), []
    except (ValidationError, yaml.YAMLError) as err:
        return None, [Problem(("sysctl", "profile"), f"profile file {path} is invalid: {err}")]


def _from_pydantic_errors(errors: list[Any]) -> list[Problem]:
    # pydantic adds "too short" for a list whose only items failed; the item errors say more
    failed = {tuple(e["loc"][:1]) for e in errors if len(e["loc"]) > 1}
    return [
        _from_pydantic(e) for e in errors
        if not (e["type"] == "too_short" and tuple(e["loc"]) in failed)
    ]


def _from_pydantic(error: Any) -> Problem:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    given = error.get("input")
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        camel = to_camel(str(loc[-1]))
        close = [camel] if camel in known else difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if camel in known and camel != loc[-1]:
            hint = f"write it as {camel!r} (stack files use the camelCase names only); "
        return Problem(loc, f"unknown key; {hint}known keys here: {', '.join(known)}")
    if kind == "missing":
        return Problem(loc, "is required but missing")
    if kind == "too_short":
        return Problem(loc, f"needs at least {error.get('ctx', {}).get('min_length', 1)} entry")
    if kind == "string_pattern_mismatch" and loc[-1] == "name":
        return Problem(loc, f"{given!r} is not a valid name: 1-32 lowercase letters, digits and '-', "
                       "starting with a letter and not ending with '-' (it names Azure resources and directories)")
    if kind == "string_pattern_mismatch" and given == "latest":
        return Problem(loc, "'latest' is refused: pin a version, so that a new image arrives as a reviewed "
                            "stack change and not with the next VM Azure creates")
    if kind == "string_type" and isinstance(given, int | float) and not isinstance(given, bool):
        example = " like '1.34.2'" if loc[-1] == "kubernetesVersion" else ""
        return Problem(loc, f"YAML reads the unquoted {given!r} as a number; write the value in quotes{example}")
    if kind == "ip_v4_network" and isinstance(given, str):
        try:
            network = IPv4Network(given, strict=False)
        except ValueError:
            pass
        else:
            return Problem(loc, f"{given} has host bits set; write the network itself: {network}")
    message = error["msg"].removeprefix("Value error, ")
    if kind != "value_error" and not isinstance(given, dict | list):
        message += f" (got {given!r})"
    return Problem(loc, message)


def _known_keys(loc: Loc) -> list[str]:
    """The camelCase keys allowed at `loc`, found by walking ClusterConfig's field types."""
    model: Any = ClusterConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = _fields_by_alias(model).get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    return sorted(_fields_by_alias(model))


def _fields_by_alias(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or n): f for n, f in model.model_fields.items()}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _with_lines(problems: list[Problem], root: yaml.Node | None) -> list[Problem]:
    return [Problem(p.loc, p.message, p.line or _line_of(p.loc, root)) for p in problems]


def _line_of(loc: Loc, root: yaml.Node | None) -> int | None:
    """1-based line of the deepest node along `loc` under config.kilonode:cluster."""
    if loc and isinstance(loc[0], str) and loc[0].startswith("kilonode:"):
        return _line(_key_node(_child(root, "config"), loc[0]))
    node = _child(_child(root, "config"), CONFIG_KEY)
    if node is None:
        return _line(_child(root, "config")) or _line(root)
    line = _line(node)
    for part in loc:
        child = _child(node, part)
        if child is None:
            return line
        line = _line(_key_node(node, part)) or _line(child)
        node = child
    return line


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == part:
                return value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part]
    return None


def _key_node(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, _value in node.value:
            if key.value == part:
                return key
    return None


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None
