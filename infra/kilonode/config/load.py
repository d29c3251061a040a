"""Load a stack file, validate it once, and report every problem with file, line and field.

The stack file is a Pulumi stack config file (`stacks/Pulumi.<stack>.yaml`); kilonode reads
the structured value under `kilonode:cluster`. Problems are collected, never thrown one at a
time: a user fixing a stack sees everything wrong in one run.

The file is hostile until proven otherwise: it is read only up to MAX_FILE_BYTES, and only if
it is a regular file (not a FIFO, a device or a symbolic-link loop); its YAML structure is checked
event by event before anything is built from it (one document, no merge keys or tags, bounded
nesting and alias expansion in values and in characters, no key given twice, and no scalar that
PyYAML and Pulumi's Go YAML would read differently: kilonode.config.reading; each refused at its
own line and field path), and every value an error quotes is shown at most ~80 characters long.

Every command and the Pulumi program read a stack file here, through load_stack (the program
through program_stack, which also checks that Pulumi's own reading of the file is the same).
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field, replace
from functools import lru_cache
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from kilonode.config.checks import archive_problems, cross_field_problems
from kilonode.config.model import ClusterConfig
from kilonode.config.reading import first_difference, plain_scalar_problem, pulumi_key
from kilonode.config.sysctl_profile import SysctlProfile
from kilonode.config.values import shown
from kilonode.paths import EXAMPLE_STACKS_DIR, SYSCTL_DIR
from kilonode.problems import Loc, PlanError, Problem, StackError
from kilonode.yamlio import load_yaml

CONFIG_KEY = "kilonode:cluster"
# The largest stack file read: research-7500's is under 4 KiB; anything near this is not a
# stack file, and YAML would take minutes over 50 MB.
MAX_FILE_BYTES = 1024 * 1024
# Values in the document once aliases are expanded: far above any stack (research-7500 has a
# few hundred), far below what an alias bomb makes of a few lines (a billion).
MAX_VALUES = 100_000
# Characters in the document once aliases are expanded: a file without aliases holds at most
# MAX_FILE_BYTES; an alias repeats its anchor's characters, and a 60 kB string behind a few
# thousand aliases is gigabytes for whatever copies or prints the value (Pulumi's YAML encoder
# writes it out expanded, and an error message quoting a list would too).
MAX_EXPANDED_CHARS = 2 * MAX_FILE_BYTES
# Collections inside collections: a stack file needs 6 (config, the cluster, nodePools, a
# pool, its preloadImages, an entry); PyYAML builds nodes recursively, so a deeper file could
# exhaust the stack.
MAX_DEPTH = 16
# The config keys outside `kilonode:` a stack file may set, each with why and the form its value
# must have. Pulumi hands every other namespace's keys to that provider or to the engine
# (`azure-native:*` to the Azure provider, `kubernetes:*` to the Kubernetes one, `pulumi:*` to the
# engine: `pulumi:disable-default-providers`, ...), so one could move the cluster to another tenant,
# point the in-cluster half at another kubeconfig, or change what the engine does, while no
# kilonode command checks it and `kilonode diff` would not show it. The program names every
# provider's settings itself (kilonode.azure.program, kilonode.k8s.incluster), and credentials
# come from the environment, never the stack file.
GUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
PROVIDER_KEYS: dict[str, tuple[str, str, str]] = {
    # key: (why it is allowed, the value's pattern, the value in words)
    "azure-native:subscriptionId": (
        "each cluster of a fleet goes in a subscription of its own (NICs, VNets and vCPU quota are counted per "
        "subscription and region: kilonode fleet writes its stacks to say so)", GUID, "a subscription ID (a GUID)"),
}

# How long a message about a stack may be, whatever it quotes (a safety net: values are
# already shown truncated).
MAX_MESSAGE = 600


@dataclass(frozen=True)
class Stack:
    """A validated stack: its name, where it came from, its config and sysctl profile."""

    name: str
    file: Path
    config: ClusterConfig
    sysctl_profile: SysctlProfile
    raw: dict[str, Any]  # the `kilonode:cluster` value as the file holds it (what Pulumi's config reads)
    # the config keys outside kilonode's that the file sets (PROVIDER_KEYS only): `kilonode diff` shows them
    provider_config: dict[str, str] = field(default_factory=dict)


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
        project = load_yaml((root / "Pulumi.yaml").read_text(encoding="utf-8")) or {}
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
        return candidate  # read_text says why it cannot be read, if it cannot
    dirs = stack_dirs(stacks_dir)
    for folder in dirs:
        named = folder / f"Pulumi.{ref}.yaml"
        if os.path.lexists(named):  # a dangling link or a link loop too: read_text names it
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
    problems = structure_problems(text)
    if problems:
        raise StackError(display_path(file), _with_lines(problems, None))
    loader = UniqueKeyLoader(text)
    try:
        # composed once: the nodes give the problems their lines, the document the values
        root = loader.get_single_node()
        document = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as err:
        raise StackError(display_path(file), [_yaml_problem(err, text)]) from None
    finally:
        loader.dispose()
    raw, problems = _cluster_value(document, root)
    provider, provider_problems = provider_config(document, root)
    project = project_root(file.parent) or file.parent
    stack = _validated(stack_name_of(file), file, raw, problems + provider_problems, sysctl_dir, project, root)
    return replace(stack, provider_config=provider)


def _yaml_problem(error: yaml.YAMLError, text: str) -> Problem:
    """A YAML error as one problem at its line (a character YAML refuses has no mark, only a
    position)."""
    if isinstance(error, yaml.reader.ReaderError):
        line = text[: error.position].count("\n") + 1
        return Problem((), f"not valid YAML: the character {shown(chr(error.character))} is not allowed in YAML; "
                           "write it as an escape in double quotes, or remove it", line)
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark else 1
    return Problem((), f"not valid YAML: {getattr(error, 'problem', None) or error}", line)


def read_text(file: Path) -> str:
    """The stack file's text, or a StackError at its line 1 saying why it cannot be read. Opened
    without blocking and read only if it is a regular file: a FIFO would wait for a writer
    forever, /dev/zero or /dev/urandom never end, and a directory or a device is no stack."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise _unreadable(file, error) from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise StackError(display_path(file), [Problem(
                (), f"is {kind}, not a stack file; give the path of a Pulumi.<stack>.yaml file", 1)])
        data = _read_at_most(fd, MAX_FILE_BYTES + 1)
    except OSError as error:
        raise _unreadable(file, error) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise StackError(display_path(file), [Problem(
            (), f"is larger than {MAX_FILE_BYTES // 1024} KiB, the most a stack file may be (a large cluster's is "
                "a few KiB); this is not a stack file", 1)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise StackError(display_path(file), [Problem(
            (), f"byte 0x{data[error.start]:02x} at column {column} is not UTF-8; save the file as UTF-8",
            line)]) from None


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def _unreadable(file: Path, error: OSError) -> StackError:
    """Why the stack file cannot be opened or read, and what to do, at its line 1."""
    why = {
        errno.ELOOP: "is a symbolic link that leads back to itself (a loop of links); point the link at a stack "
                     "file, or give the file's own path",
        errno.ENOENT: "no such stack file; check the path (or give a stack name)",
        errno.EACCES: "cannot be read (permission denied); make it readable for this user",
        errno.EISDIR: "is a directory, not a stack file; give the path of a Pulumi.<stack>.yaml file",
        errno.ENOTDIR: "no such stack file: a folder on its path is a file; check the path",
        errno.ENAMETOOLONG: "the path is too long; check it",
    }.get(error.errno or 0, f"cannot be read: {error.strerror or error}; check that it is a readable stack file")
    return StackError(display_path(file), [Problem((), why, 1)])


@dataclass
class _Collection:
    """A map or list being read, in structure_problems."""

    path: tuple[Any, ...]  # in the document: ("config", "kilonode:cluster", "nodePools", 0, ...)
    is_map: bool
    keys: dict[Any, int]  # a map's keys so far (as Pulumi hands them over), with the line each was given on
    line: int  # where it starts
    index: int = 0  # a list's next index
    key: Any = None  # a map's key whose value comes next
    has_key: bool = False
    secure_text: bool = False  # its `secure` key holds text: Pulumi's encrypted-secret form


_SCALARS = yaml.SafeLoader("")
# libyaml's parser where PyYAML has it (PyPI's wheels do): the same events and marks, and a
# 1 MiB file read in a fraction of the pure-Python parser's seconds
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _key_value(event: yaml.ScalarEvent) -> Any:
    """What a scalar key is to YAML (1 and '1' differ, 'name' and "name" do not)."""
    tag = event.tag or _SCALARS.resolve(yaml.ScalarNode, event.value, event.implicit)
    try:
        return _SCALARS.construct_object(yaml.ScalarNode(tag, event.value, style=event.style))
    except (yaml.YAMLError, ValueError):
        return event.value


def _pyyaml_tag(event: yaml.ScalarEvent) -> str:
    """The short tag PyYAML (YAML 1.1) gives an untagged scalar: `str`, `int`, `bool`, ..."""
    return str(_SCALARS.resolve(yaml.ScalarNode, event.value, event.implicit)).rsplit(":", 1)[-1]


def _plain(event: yaml.NodeEvent) -> bool:
    return isinstance(event, yaml.ScalarEvent) and not event.style and event.tag is None


def _document_loc(path: tuple[Any, ...]) -> Loc:
    """A document path as a problem's loc: relative to kilonode:cluster, or the config key."""
    if path[:2] == ("config", CONFIG_KEY):
        return tuple(path[2:])
    if len(path) >= 2 and path[0] == "config":
        return tuple(path[1:])
    return ()


class _Stop(Exception):
    """What follows a problem cannot be read (a key that is not a value, a bomb, a second document)."""


class _Reader:
    """structure_problems' state: the open collections, what the values expand to, the problems."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.open: list[_Collection] = []
        self.documents = 0
        self.values = 0  # values in the document once aliases are expanded
        self.chars = 0  # characters of its scalars, keys included, likewise
        # an anchor's (values, chars) once expanded, and where each open anchored collection started
        self.sizes: dict[str, tuple[int, int]] = {}
        self.anchored: list[tuple[str, int, int] | None] = []

    def event(self, event: yaml.Event, line: int) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                self.problems.append(Problem((), "a second YAML document ('---'): a stack file is one document; "
                                                 "remove the '---' and what follows it", line))
                raise _Stop
        elif isinstance(event, yaml.CollectionEndEvent):
            self.close(line)
        elif isinstance(event, yaml.NodeEvent):
            where = self.open[-1] if self.open else None
            if where is not None and where.is_map and not where.has_key:
                self.key(event, where, line)
            else:
                self.value(event, where, line)

    def key(self, event: yaml.NodeEvent, where: _Collection, line: int) -> None:
        problem, fatal = _key_problem(event, where, line)
        if problem is not None:
            self.problems.append(problem)
            if fatal:
                raise _Stop  # a key that is not a value: what follows cannot be placed
        self.count(1, len(event.value) if isinstance(event, yaml.ScalarEvent) else 0, where.path, line)

    def value(self, event: yaml.NodeEvent, where: _Collection | None, line: int) -> None:
        path = _node_path(where)
        if isinstance(event, yaml.AliasEvent):
            self.count(*self.sizes.get(event.anchor or "", (1, 0)), path, line)
            return
        scalar = len(event.value) if isinstance(event, yaml.ScalarEvent) else 0
        self.count(1, scalar, path, line)
        if getattr(event, "tag", None) is not None:  # set only when the file writes one
            self.problems.append(Problem(_document_loc(path), f"a YAML tag ({shown(event.tag, 60)}): stack files "
                                         "hold plain maps, lists and values; remove the tag", line))
        if isinstance(event, yaml.ScalarEvent):
            self.scalar(event, where, path, line)
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(self.open) >= MAX_DEPTH:
                self.problems.append(Problem(_document_loc(path)[:1], f"nested more than {MAX_DEPTH} maps and lists "
                                             f"deep at line {line}; no stack key takes that", line))
                raise _Stop
            self.open.append(_Collection(path, isinstance(event, yaml.MappingStartEvent), {}, line))
            self.anchored.append((event.anchor, self.values - 1, self.chars) if event.anchor else None)

    def scalar(self, event: yaml.ScalarEvent, where: _Collection | None, path: tuple[Any, ...], line: int) -> None:
        if event.anchor:
            self.sizes[event.anchor] = (1, len(event.value))
        text_value = True
        if _plain(event):
            tag = _pyyaml_tag(event)
            text_value = tag == "str"
            problem = plain_scalar_problem(event.value, tag)
            if problem is not None:
                self.problems.append(Problem(_document_loc(path), problem, line))
        if where is not None and where.is_map and path[-1] == "secure" and text_value:
            where.secure_text = True

    def close(self, line: int) -> None:
        done = self.open.pop()
        anchor = self.anchored.pop()
        if anchor is not None:
            self.sizes[anchor[0]] = (self.values - anchor[1], self.chars - anchor[2])
        if done.is_map and done.secure_text and len(done.keys) == 1:
            loc = (CONFIG_KEY,) if done.path == ("config", CONFIG_KEY) else _document_loc(done.path)
            self.problems.append(Problem(loc, "a map whose only key is `secure` is an encrypted secret to Pulumi (it "
                                         "decrypts the text and hands the program that instead); no stack key takes "
                                         "a secret: rename the key or add the map's other keys", done.line))

    def count(self, values: int, chars: int, path: tuple[Any, ...], line: int) -> None:
        """Add a value (or an alias's expansion); stop at a bomb."""
        self.values += values
        self.chars += chars
        if self.values > MAX_VALUES:
            self.problems.append(Problem(_document_loc(path), f"the file holds more than {MAX_VALUES:,} values once "
                                         "its aliases are expanded (an alias bomb?); a stack has a few hundred", line))
            raise _Stop
        if self.chars > MAX_EXPANDED_CHARS:
            self.problems.append(Problem(_document_loc(path), f"the file holds more than {MAX_EXPANDED_CHARS >> 20} "
                                         "MiB of text once its aliases are expanded (an alias bomb?); a stack has a "
                                         "few KiB: write the values out without aliases", line))
            raise _Stop


def structure_problems(text: str) -> list[Problem]:
    """What YAML itself would accept but a stack file must not hold, read event by event
    (nothing is built, so nothing can grow): a second document, a merge key, a tag, a key that
    is not a plain value, a key given twice, nesting beyond MAX_DEPTH, aliases that expand to
    more than MAX_VALUES values or MAX_EXPANDED_CHARS characters (an alias bomb: a billion from
    a few lines), a plain scalar that PyYAML and Pulumi would read differently
    (kilonode.config.reading), and a map Pulumi would take for an encrypted secret. Each at its
    line and field path; a YAML syntax error is one problem at its line."""
    reader = _Reader()
    try:
        for event in yaml.parse(text, Loader=_FAST_LOADER):
            reader.event(event, event.start_mark.line + 1)
    except _Stop:
        pass
    except yaml.YAMLError as error:
        reader.problems.append(_yaml_problem(error, text))
    return reader.problems


def _node_path(where: _Collection | None) -> tuple[Any, ...]:
    """The path of the value that comes next in `where`, and move `where` past it."""
    if where is None:
        return ()
    if where.is_map:
        where.has_key = False
        return (*where.path, where.key)
    where.index += 1
    return (*where.path, where.index - 1)


def _key_problem(event: yaml.NodeEvent, where: _Collection, line: int) -> tuple[Problem | None, bool]:
    """Take `event` as the next key of the map `where`; the problem with it, if any, and whether
    what follows can still be read."""
    loc = _document_loc(where.path)
    if not isinstance(event, yaml.ScalarEvent):
        return Problem(loc, "a key that is a map, a list or an alias: keys are plain names", line), True
    if event.value == "<<" and event.implicit[0]:  # a plain `<<`: YAML 1.1's merge key
        return Problem(_document_loc((*where.path, "<<")), "a YAML merge key ('<<:'): stack files take none (YAML "
                       "1.2 dropped them, and a reviewer must see each value where it applies); write the keys out",
                       line), True
    key = pulumi_key(_key_value(event))
    try:
        first = where.keys.get(key)
    except TypeError:  # an unhashable key YAML built from a tag
        return Problem(loc, "a key that is not a plain name", line), True
    where.key, where.has_key = key, True
    if first is not None:
        path = (*where.path, key)
        loc = (CONFIG_KEY,) if path == ("config", CONFIG_KEY) else _document_loc(path)
        return Problem(loc, f"given twice (first on line {first}); YAML would keep only the last one silently: "
                            "remove one of them", line), False
    where.keys[key] = line
    problem = plain_scalar_problem(event.value, _pyyaml_tag(event), is_key=True) if _plain(event) else None
    if problem is not None:  # at the key as the file writes it (Pulumi's text for it may differ)
        return Problem(_document_loc((*where.path, event.value)), problem, line), False
    return None, False


class UniqueKeyLoader(_FAST_LOADER):  # type: ignore[misc,valid-type]
    """SafeLoader that refuses a key given twice in one map (PyYAML keeps the last silently) and
    gives a map's keys as Pulumi's config does (a decimal key as its text: reading.pulumi_key)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = pulumi_key(self.construct_object(key_node, deep=deep))  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first given on line {seen[key]}); YAML would silently keep "
                    "only the last one: remove one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
            mapping[key] = self.construct_object(value_node, deep=deep)  # type: ignore[no-untyped-call]
        return mapping


def stack_from_value(name: str, raw: Any, file: Path, sysctl_dir: Path = SYSCTL_DIR) -> Stack:
    """Validate a `kilonode:cluster` value already read by someone else (the Pulumi
    program reads it with pulumi.Config); `file` is where it came from, for messages."""
    problems: list[Problem] = []
    if not isinstance(raw, dict):
        problems.append(Problem((), f"'{CONFIG_KEY}' must be a map (at least name and nodePools)"))
        raw = None
    return _validated(name, file, raw, problems, sysctl_dir)


def program_stack(name: str, value: Any, file: Path, sysctl_dir: Path = SYSCTL_DIR) -> Stack:
    """The stack `pulumi up` deploys: its file read and checked by load_stack, as every command
    reads it (the file's lines in every problem), and `value`, Pulumi's own reading of
    `kilonode:cluster` (pulumi.Config: the file through Go's YAML and JSON), the same value for
    value. They differ only where something besides the file feeds Pulumi's config (an ESC
    environment, `--config-file`, the project's own config) or where the two YAML readers
    differ in a way kilonode.config.reading does not know yet: refused, naming the place."""
    stack = load_stack(str(file), sysctl_dir=sysctl_dir)
    where = first_difference(stack.raw, value)
    if where is None:
        return replace(stack, name=name)
    ours, theirs = _at(stack.raw, where), _at(value, where)
    return _raise(file, [Problem(where, (
        f"Pulumi hands the program {_yaml_reading(theirs)} here, where this file reads {_yaml_reading(ours)}: the "
        "cluster `pulumi up` would deploy is not the one kilonode checked (an ESC environment, `--config-file`, "
        f"config in Pulumi.yaml, or YAML the two readers take differently); keep '{CONFIG_KEY}' in this file alone"))])


_MISSING = object()


def _at(value: Any, path: Loc) -> Any:
    for part in path:
        inside = part in value if isinstance(value, dict) else (
            isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value))
        if not inside:
            return _MISSING
        value = value[part]
    return value


def _raise(file: Path, problems: list[Problem]) -> NoReturn:
    raise StackError(display_path(file), _with_lines(problems, _compose(file)))


def _validated(
    name: str, file: Path, raw: dict[str, Any] | None, problems: list[Problem], sysctl_dir: Path,
    project: Path | None = None, root: yaml.Node | None = None,
) -> Stack:
    """`project`: where the stack's files (image archives) are, when they must exist now;
    `root`: the file's YAML nodes, when the caller has them."""
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
    if config is not None and project is not None:
        problems += archive_problems(config, project)
    if problems or config is None or profile is None:
        raise StackError(display_path(file), _with_lines(problems, root or _compose(file)))
    return Stack(name, file, config, profile, raw or {})


def _compose(file: Path) -> yaml.Node | None:
    """The file's YAML nodes, for lines: only a file that passed read_text and structure_problems
    (the Pulumi program's stack_from_value reads one that did not)."""
    try:
        text = read_text(file)
        return None if structure_problems(text) else yaml.compose(text, Loader=_FAST_LOADER)
    except (StackError, yaml.YAMLError):
        return None


def with_lines(stack: Stack, error: PlanError) -> StackError:
    """Turn a planner's problems into a StackError pointing into the stack file."""
    return StackError(display_path(stack.file), _with_lines(error.problems, _compose(stack.file)))


def display_path(file: Path) -> str:
    """The path as a user would type it: relative to the working directory when inside it (and
    as given where it cannot be resolved: a link loop, a missing folder)."""
    try:
        return str(file.resolve().relative_to(Path.cwd()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop from ..."
        return str(file)


def _cluster_value(document: Any, root: yaml.Node | None = None) -> tuple[dict[str, Any] | None, list[Problem]]:
    """`kilonode:cluster` as Pulumi's config holds it, and the problems of the keys around it:
    Pulumi prefixes a config key with no `:` by the project's name (loaders.go:61-89), so
    `cluster:` is `kilonode:cluster` and `foo:` is `kilonode:foo`, and merges an ESC
    environment's config over the file's (`environment:`)."""
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        return None, [Problem((), f"a stack file needs a top-level 'config:' map holding '{CONFIG_KEY}:'")]
    config = document["config"]
    problems = []
    if "environment" in document:
        problems.append(Problem(("environment",), "an ESC environment: `pulumi up` would merge its config over this "
                                "file's, so the cluster it deploys could differ from the one every kilonode command "
                                "checks; remove `environment:` and keep the cluster in this file",
                                _line(_key_node(root, "environment"))))
    for key in config:
        if isinstance(key, str) and ":" in key and not key.startswith("kilonode:"):
            continue  # another namespace's: provider_config
        if not isinstance(key, str) or (key.startswith("kilonode:") and key != CONFIG_KEY):
            problems.append(Problem((key,), f"unknown kilonode setting; everything goes under '{CONFIG_KEY}'"))
        elif ":" not in key:
            what = ("a config key with no ':' is '<project>:" + key + "' to Pulumi (it prefixes the project's name, "
                    "which may be kilonode, and then two keys could name one value); kilonode reads only "
                    f"'{CONFIG_KEY}': " + (f"write '{CONFIG_KEY}'" if key == "cluster" else "remove this key"))
            problems.append(Problem((key,), what, _line(_key_node(_child(root, "config"), key))))
    raw = config.get(CONFIG_KEY)
    if not isinstance(raw, dict):
        problems.append(Problem((), f"'config:' needs a '{CONFIG_KEY}:' map (at least name and nodePools)"))
        return None, problems
    return raw, problems


def provider_config(document: Any, root: yaml.Node | None = None) -> tuple[dict[str, str], list[Problem]]:
    """The file's config keys outside `kilonode:` (PROVIDER_KEYS' values), and a problem at its line
    for every other such key or a value of the wrong form."""
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        return {}, []
    found: dict[str, str] = {}
    problems = []
    for key, value in config.items():
        if not isinstance(key, str) or ":" not in key or key.startswith("kilonode:"):
            continue
        line = _line(_key_node(_child(root, "config"), key))
        allowed = PROVIDER_KEYS.get(key)
        if allowed is None:
            namespace = key.split(":", 1)[0]
            problems.append(Problem((key,), f"`pulumi up` hands this to {shown(namespace, 40)} (a provider's or the "
                                    "engine's setting), where no kilonode command checks it and `kilonode diff` does "
                                    "not show it; a stack file sets only "
                                    f"{', '.join(sorted(PROVIDER_KEYS))} beside '{CONFIG_KEY}': remove it", line))
        elif not isinstance(value, str) or re.fullmatch(allowed[1], value) is None:
            problems.append(Problem((key,), f"takes {allowed[2]}, and YAML reads {_yaml_reading(value)} here; write "
                                    f"{allowed[2]} in quotes", line))
        else:
            found[key] = value
    return found, problems


def _load_profile(name: str, sysctl_dir: Path) -> tuple[SysctlProfile | None, list[Problem]]:
    path = sysctl_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in sysctl_dir.glob("*.yaml")))
        return None, [Problem(("sysctl", "profile"), f"no profile {name!r} in {sysctl_dir}; known: {known}")]
    try:
        return SysctlProfile.model_validate(load_yaml(path.read_text())), []
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
    if "[key]" in loc:  # a map's key was refused: the entry's own path (_with_lines makes it printable)
        loc = loc[: loc.index("[key]")]
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        camel = to_camel(str(loc[-1]))
        close = [camel] if camel in known else difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if camel in known and camel != loc[-1]:
            hint = f"write it as {camel!r} (stack files use the camelCase names only); "
        return Problem(loc, f"unknown key; {hint}known keys here: {', '.join(known)}")
    if kind == "missing":
        return Problem(loc, _MISSING_HINTS.get(loc, "is required but missing"))
    if kind == "too_short":
        return Problem(loc, f"needs at least {error.get('ctx', {}).get('min_length', 1)} entry")
    if kind == "too_long":  # kilonode.config.model.CUSTOM_DATA_BOUNDS
        most = error.get("ctx", {}).get("max_length")
        count = len(given) if isinstance(given, dict | list | tuple) else "more"
        return Problem(loc, f"holds {count} entries, more than the {most} a stack may give here: each lands in a "
                            "machine's custom data, which Azure caps at 64 KiB (kilonode.azure.custom_data); keep the "
                            "ones you need, or move the rest into the node image")
    if kind == "string_pattern_mismatch" and loc[-1] == "name":
        return Problem(loc, f"{shown(given)} is not a valid name: 1-32 lowercase letters, digits and '-', starting "
                       "with a letter and not ending with '-' (it names Azure resources and directories)")
    if kind == "string_pattern_mismatch" and given == "latest":
        return Problem(loc, "'latest' is refused: pin a version, so that a new image arrives as a reviewed "
                            "stack change and not with the next VM Azure creates")
    if kind == "string_type" and isinstance(given, int | float) and not isinstance(given, bool):
        example = " like '1.34.2'" if loc[-1] == "kubernetesVersion" else ""
        return Problem(loc, f"YAML reads the unquoted {given!r} as a number; write the value in quotes{example}")
    if kind in _TAKES:
        return Problem(loc, f"takes {_TAKES[kind]}, and YAML reads {_yaml_reading(given)} here{_hint(kind, given)}")
    if kind == "ip_v4_network" and isinstance(given, str):
        try:
            network = IPv4Network(given, strict=False)
        except ValueError:
            pass
        else:
            return Problem(loc, f"{given} has host bits set; write the network itself: {network}")
    message = error["msg"].removeprefix("Value error, ")
    if kind != "value_error" and not isinstance(given, dict | list):
        message += f" (got {shown(given)})"
    return Problem(loc, message)


# what to write where a required key is missing and "is required but missing" would not say
_MISSING_HINTS: dict[Loc, str] = {
    ("joinTokens",): "is required: every pool's VMs join with a token from their custom data, and one without an "
                     "expiry could join nodes forever; add joinTokens: {current: {generation: 1, expires: "
                     "'<RFC 3339 UTC, months ahead>'}} (docs/azure.md, \"Node join credentials\")",
    ("joinTokens", "current"): "is required: the generation every pool's custom data carries; add current: "
                               "{generation: 1, expires: '<RFC 3339 UTC, months ahead>'}",
}

# strict types: what a key of each kind takes
_TAKES = {"int_type": "a whole number", "bool_type": "true or false", "string_type": "text",
          "int_from_float": "a whole number"}


def _yaml_reading(given: Any) -> str:
    """What YAML made of the value, in words."""
    if given is _MISSING:
        return "nothing"
    if isinstance(given, bool):
        return f"the boolean {str(given).lower()}"
    if isinstance(given, int | float):
        return f"the number {shown(given)}"
    if isinstance(given, str):
        return f"the text {shown(given)}"
    if given is None:
        return "nothing (null)"
    return {list: "a list", dict: "a map"}.get(type(given), f"a {type(given).__name__} ({shown(given)})")


def _hint(kind: str, given: Any) -> str:
    if kind in ("int_type", "int_from_float") and isinstance(given, str):
        return "; write the number without quotes"
    if kind in ("int_type", "int_from_float") and isinstance(given, float):
        return "; write it without a decimal point"
    if kind == "int_type" and isinstance(given, bool):
        return "; write a number, not true or false"
    if kind == "bool_type" and isinstance(given, str):
        return "; write true or false without quotes"
    if kind == "bool_type" and isinstance(given, int):
        return "; write true or false, not a number"
    return ""


def _showable(part: Any) -> bool:
    """Whether a key can stand in a field path as it is: printable, no spaces, not long."""
    return isinstance(part, int) or (isinstance(part, str) and part.isprintable() and " " not in part
                                     and 0 < len(part) <= 80)


def _safe_part(part: str | int) -> str | int:
    """A loc part as a one-line, bounded piece of a field path."""
    if _showable(part):
        return part
    text = ascii(str(part))[1:-1].replace(" ", "\\x20")
    return text if len(text) <= 80 else f"{text[:77]}..."


def _safe_message(message: str) -> str:
    """One line, bounded: a safety net under the messages, which already quote values truncated."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)
    return text if len(text) <= MAX_MESSAGE else f"{text[: MAX_MESSAGE - 3]}..."


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
    """Every problem at a line (the file's first, when nothing in it is nearer), its path and
    message made safe to print on one line."""
    return [
        Problem(tuple(_safe_part(part) for part in p.loc), _safe_message(p.message),
                p.line or _line_of(p.loc, root) or 1)
        for p in problems
    ]


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


@lru_cache(maxsize=256)
def _entries(node: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A map's (key node, value node) by key text, built once per map: a file with thousands
    of problems in one map looks each up in constant time."""
    entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, value in node.value:
        entries.setdefault(str(key.value), (key, value))
    return entries


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        # a YAML key is text here; a member number is an int in a loc
        return _entries(node).get(str(part), (None, None))[1]
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part]
    return None


def _key_node(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return _entries(node).get(str(part), (None, None))[0]
    return None


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None
