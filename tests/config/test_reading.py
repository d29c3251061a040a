"""Reading a stack file as `pulumi up` will (kilonode.config.reading): what the two YAML readers
take alike is read, what they could take differently is refused; the safe spelling of each
refused construct is accepted; a file that cannot be read as a stack file (a link loop, a FIFO,
a device, a directory) ends in one `file:1:` line; and an alias bomb of text is refused under a
memory limit before anything echoes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.config.load import MAX_EXPANDED_CHARS
from kilonode.config.reading import first_difference, go_number, plain_scalar_problem, pulumi_key, pyyaml_value
from kilonode.paths import EXAMPLE_STACKS_DIR, REPO_ROOT
from kilonode.problems import StackError
from tests.config.test_hostile_stacks import MAX_OUTPUT, PROBLEM_LINE

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

LOCAL = (EXAMPLE_STACKS_DIR / "Pulumi.local.yaml").read_text(encoding="utf-8")


def _pyyaml_tag(text: str) -> str:
    return str(yaml.SafeLoader("").resolve(yaml.ScalarNode, text, (True, False))).rsplit(":", 1)[-1]


# Read alike by PyYAML and by Pulumi (yaml.v3, then JSON): accepted as they are.
ALIKE = ["0", "-0", "12", "-3", "0.5", "-1.25", "1.50", "true", "True", "FALSE", "null", "~", "", "1.2.3", "abc",
         "10.0.0.0/16", "v1.34.2", "2027", "1.34.2", "18446744073709551615", "-9223372036854775808", "x1", "0.1"]
# Read differently, or read alike by both but not by YAML 1.2 and a reviewer: refused.
DIFFERENT = ["yes", "No", "ON", "off", "y", "N", "012", "0o12", "0x1F", "0X1F", "0b1", "-0b1", "1_000", "1_", "1:20",
             "1:20.5", "1e3", "1.5e3", "1.0e+3", ".5", "+5", "8.0", "1.", "-0.0", "08", ".inf", "-.Inf", "+.INF",
             ".NaN", "2027-11-30", "2027-1-2", "2027-11-30T00:00:00Z", "2027-1-2 3:04:05", "18446744073709551616",
             "-9223372036854775809", "=", "<<", "0x", "1e400", "123456789012345678.5"]


@pytest.mark.parametrize("text", ALIKE)
def test_a_plain_scalar_both_readers_take_alike_is_accepted(text: str) -> None:
    assert plain_scalar_problem(text, _pyyaml_tag(text)) is None


@pytest.mark.parametrize("text", DIFFERENT)
def test_a_plain_scalar_the_readers_could_take_differently_is_refused_with_what_to_write(text: str) -> None:
    problem = plain_scalar_problem(text, _pyyaml_tag(text))
    assert problem is not None and ("quotes" in problem or "no key takes" in problem), problem


@pytest.mark.parametrize(("text", "go"), [
    # go-yaml/yaml@v3.0.1:resolve.go:191-209: `_` dropped, Go's base prefixes, legacy octal, then floats
    ("0o12", 10), ("012", 10), ("0X1F", 31), ("1_000", 1000), ("-0b101", -5), ("08", 8.0), ("1e3", 1000.0),
    ("99999999999999999999", 1e20), ("18446744073709551615", 2**64 - 1), (".5", 0.5),
    # text to yaml.v3: base 60 dropped (:165-167); ParseFloat on `.` text keeps `_` (:173-177); overflow
    ("1:20", "1:20"), (".5_0", ".5_0"), ("1e400", "1e400"),
])
def test_go_number_reads_as_yaml_v3_resolves(text: str, go: object) -> None:
    assert go_number(text) == go and type(go_number(text)) is type(go)


def test_pyyaml_reads_yaml_1_1() -> None:
    assert (pyyaml_value("yes"), pyyaml_value("1:20"), pyyaml_value("0o12"), pyyaml_value("1e3")) == (
        True, 80, "0o12", "1e3")


def test_a_plain_decimal_key_is_text_as_pulumi_hands_it_over() -> None:
    assert (pulumi_key(3), pulumi_key("3"), pulumi_key("a")) == ("3", "3", "a")
    assert first_difference({"a": [1, {"b": 1}]}, {"a": [1, {"b": 1.0}]}) == ("a", 1, "b")
    assert first_difference({"a": True}, {"a": 1}) == ("a",)
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == ("a", 1)
    assert first_difference({"a": [1]}, {"a": [1]}) is None


SAFE = LOCAL.replace("        podsPerNode: 8\n", """        podsPerNode: 8
        labels:
          example.com/flag: "yes"
          example.com/on: 'on'
          example.com/octal: "0o12"
          example.com/since: "2027-01-01"
          example.com/exp: "1e3"
          example.com/whole: "8.0"
          example.com/y: "y"
          "3": three
""", 1).replace("        vmSize: Standard_D4ds_v5\n        localDisk: {device: /dev/vdb}\n      events:", """\
        vmSize: Standard_D4ds_v5
        vmSizeOverrides: {1: Standard_D8ds_v5}
        quotaBackendBytes: 4294967296
        localDisk: {device: /dev/vdb}
      events:""", 1)


def test_the_safe_spelling_of_each_refused_construct_is_read_as_written(tmp_path: Path) -> None:
    """Quoted, each value is the text it reads as, to PyYAML and to Pulumi alike; a plain
    decimal key is the text Pulumi hands over ("1"), which a member index takes."""
    assert SAFE.count("example.com/") == 7 and "vmSizeOverrides" in SAFE
    file = tmp_path / "Pulumi.safe.yaml"
    file.write_text(SAFE, encoding="utf-8")
    stack = load_stack(str(file))
    labels = stack.raw["nodePools"][0]["labels"]
    assert labels == {"example.com/flag": "yes", "example.com/on": "on", "example.com/octal": "0o12",
                      "example.com/since": "2027-01-01", "example.com/exp": "1e3",
                      "example.com/whole": "8.0", "example.com/y": "y", "3": "three"}
    assert stack.raw["etcd"]["main"]["vmSizeOverrides"] == {"1": "Standard_D8ds_v5"}
    assert stack.config.etcd.main.vm_size_overrides == {1: "Standard_D8ds_v5"}
    assert stack.raw["etcd"]["main"]["quotaBackendBytes"] == 4294967296
    # what Pulumi's config hands the program is JSON: the value survives it unchanged, type for type
    assert first_difference(stack.raw, json.loads(json.dumps(stack.raw))) is None


@pytest.mark.parametrize("name", ["local", "research-2500", "research-7500"])
def test_every_shipped_stack_is_a_value_pulumi_hands_over_unchanged(name: str) -> None:
    stack = load_stack(name)
    assert first_difference(stack.raw, json.loads(json.dumps(stack.raw))) is None


def test_a_leading_byte_order_mark_is_read_as_pulumi_strips_it_and_a_link_to_a_stack_is_followed(
        tmp_path: Path) -> None:
    """pulumi/pulumi@v3.259.0:sdk/go/common/workspace/loaders.go:41-46 strips a UTF-8 BOM."""
    file = tmp_path / "Pulumi.bom.yaml"
    file.write_bytes(b"\xef\xbb\xbf" + LOCAL.encode())
    assert load_stack(str(file)).raw == load_stack("local").raw
    link = tmp_path / "Pulumi.link.yaml"
    link.symlink_to(file)
    assert load_stack(str(link)).raw == load_stack("local").raw


def _problem(ref: str) -> tuple[str, int, str, str]:
    with pytest.raises(StackError) as refused:
        load_stack(ref)
    [problem] = refused.value.problems
    return refused.value.file, problem.line or 0, problem.path, problem.message


def test_a_stack_file_that_links_to_itself_is_one_line_naming_it_and_what_to_do(tmp_path: Path) -> None:
    loop = tmp_path / "Pulumi.loop.yaml"
    loop.symlink_to(loop.name)
    file, line, path, message = _problem(str(loop))
    assert (file.endswith("Pulumi.loop.yaml"), line, path) == (True, 1, "")
    assert "leads back to itself" in message and "point the link at a stack file" in message
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    file, line, _, message = _problem(str(tmp_path / "a" / "Pulumi.x.yaml"))
    assert file.endswith("Pulumi.x.yaml") and line == 1 and "leads back to itself" in message
    # found by name too: a link loop in a stacks folder is named, not "no stack named"
    assert "leads back to itself" in _problem_by_name(tmp_path, loop)


def _problem_by_name(folder: Path, loop: Path) -> str:
    with pytest.raises(StackError) as refused:
        load_stack("loop", stacks_dir=folder)
    return refused.value.problems[0].message


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.mkfifo(p), "a FIFO"),
])
def test_a_directory_or_a_fifo_is_refused_without_reading(tmp_path: Path, make: object, kind: str) -> None:
    target = tmp_path / "Pulumi.odd.yaml"
    make(target)  # type: ignore[operator]
    _, line, _, message = _problem(str(target))
    assert line == 1 and message.startswith(f"is {kind}") and "give the path of a Pulumi.<stack>.yaml" in message


@pytest.mark.parametrize("device", ["/dev/zero", pytest.param("/dev/urandom", marks=pytest.mark.slow),
                                    pytest.param("/dev/null", marks=pytest.mark.slow)])
def test_a_device_as_the_stack_path_ends_at_once(device: str) -> None:
    """In a child, under a time limit: reading /dev/zero would never end."""
    done = subprocess.run([sys.executable, "-m", "kilonode", "validate", device], capture_output=True, text=True,
                          timeout=60, check=False, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr
    assert f"{device}:1: (top level): is a character device, not a stack file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr) < MAX_OUTPUT


@pytest.mark.parametrize(("content", "line", "found"), [
    (LOCAL.replace("name: local", "name: lo\x00cal").encode(), 6, "not allowed in YAML"),
    (LOCAL.replace("name: local", "name: l\xe9").encode("latin-1"), 6, "not UTF-8"),
    (LOCAL.replace("    name: local\n", "    name: local\n\ufeff    zones: ['1']\n").encode(), 7, "not valid YAML"),
])
def test_bytes_that_are_not_a_yaml_text_are_one_line_at_their_line(tmp_path: Path, content: bytes, line: int,
                                                                   found: str) -> None:
    file = tmp_path / "Pulumi.bytes.yaml"
    file.write_bytes(content)
    _, at, _, message = _problem(str(file))
    assert at == line and found in message


def text_bomb(where: str) -> str:
    """A stack under every size limit whose aliases expand to gigabytes of text: one 60 kB string
    behind 90,000 aliases (5.4 GB), in a list a check quotes or joins."""
    refs = ", ".join(["*s"] * 90_000)
    big = "x" * 60_000
    edits = {
        "zones": ("    name: local\n", f'    name: local\n    location: &s "{big}"\n    zones: [{refs}]\n'),
        "taints": ("        podsPerNode: 8\n", f'        podsPerNode: 8\n        taints: [&s "{big}", {refs}]\n'),
        "nested": ("    name: local\n", f'    name: local\n    sshKeys: {{apiservers: &s ["{big}"]}}\n    zones: '
                   f'[{", ".join(["*s"] * 60_000)}]\n'),
    }
    old, new = edits[where]
    return LOCAL.replace(old, new, 1)


# What a refusal may take: a few hundred MB of address space for Python, pydantic and Pulumi's SDK
MEMORY_LIMIT = 400 * 1024 * 1024
LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
sys.argv = ["kilonode", *sys.argv[1:]]
from kilonode.entry import main
main()
"""


COMMANDS = (["validate"], ["render", "--out", "OUT"], ["plan"], ["fleet", "--nodes", "10", "--out", "OUT"])
BOMBS = [(where, command) for where in ("zones", "taints", "nested") for command in COMMANDS]


@pytest.mark.parametrize(("where", "command"), [
    pytest.param(where, command, marks=() if (where, command[0]) == ("zones", "validate") else pytest.mark.slow)
    for where, command in BOMBS])
def test_an_alias_bomb_of_text_is_refused_under_a_memory_limit(tmp_path: Path, where: str,
                                                               command: list[str]) -> None:
    """`kilonode diff` reads stack files from pull requests: a file under the size limit must not
    take the runner's memory, whatever a command does with it (copy, quote, join)."""
    file = tmp_path / "Pulumi.bomb.yaml"
    file.write_text(text_bomb(where), encoding="utf-8")
    assert file.stat().st_size < 1024 * 1024
    argv = [command[0], str(file), *(str(tmp_path / "out") if part == "OUT" else part for part in command[1:])]
    done = subprocess.run([sys.executable, "-c", LIMITED.format(limit=MEMORY_LIMIT), *argv], capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-2000:]
    assert "Traceback" not in output and "MemoryError" not in output and len(output.encode()) < MAX_OUTPUT
    [line] = [line for line in output.splitlines() if not line.startswith("kilonode: ")]
    match = PROBLEM_LINE.match(line)
    assert match and f"more than {MAX_EXPANDED_CHARS >> 20} MiB of text" in match["message"], line
    assert not (tmp_path / "out").exists()


def test_the_program_refuses_a_pulumi_reading_that_differs_from_its_file(tmp_path: Path) -> None:
    """Under `pulumi up` the program reads its stack file with the loader every command uses and
    takes it only if Pulumi's own reading (pulumi.Config, as JSON) is the same value: config from
    anywhere else (an ESC environment, --config-file, the project file) is refused at its line."""
    import copy
    import functools

    import pulumi

    from kilonode.azure.mockplan import run_program
    from kilonode.azure.program import main

    file = tmp_path / "Pulumi.local.yaml"
    file.write_text(LOCAL, encoding="utf-8")
    value = copy.deepcopy(load_stack(str(file)).raw)
    value["nodePools"][0]["nodes"] = 3
    with pytest.raises(pulumi.RunError) as refused:
        run_program("local", value, functools.partial(main, require_recorded_addresses=False, stack_file=file))
    [line] = [line for line in str(refused.value).splitlines() if not line.startswith("kilonode: ")]
    nodes = 1 + LOCAL[: LOCAL.index("        nodes: 2")].count("\n")
    assert line.startswith(f"{file}:{nodes}: nodePools[0].nodes: Pulumi hands the program the number 3 here, where "
                           "this file reads the number 2"), line
