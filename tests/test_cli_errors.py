"""Every expected failure, in every command: one line per problem, file:line where there is
one, what to do, exit 2 (1 only for checks that ran and failed). No traceback, ever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kilonode.cli import main
from kilonode.exit_codes import ExitCode
from kilonode.paths import REPO_ROOT


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["kilonode", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output
    return int(done.value.code or 0), output


def stack_file(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_bytes(b"config:\n  kilonode:cluster:\n" + body)
    return path


POOL = b"    nodePools:\n      - name: a\n        nodes: 1\n        vmSize: Standard_D4ds_v5\n        gpusPerNode: 0\n"


@pytest.mark.parametrize(("body", "expected"), [
    (b"    name: \xff\n" + POOL,
     "Pulumi.t.yaml:3: (top level): byte 0xff at column 11 is not UTF-8; save the file as UTF-8"),
    (b"    name: x\n    name: y\n" + POOL, "Pulumi.t.yaml:4: name: given twice (first on line 3); YAML would keep "
                                          "only the last one silently: remove one of them"),
    (b"    name: x\n    kubernetesVersion: 1.34\n" + POOL,
     "Pulumi.t.yaml:4: kubernetesVersion: YAML reads the unquoted 1.34 as a number; write the value in quotes"),
    (b"    name: x\n    network: {serviceCidr: 172.16.0.1/16}\n" + POOL,
     "network.serviceCidr: 172.16.0.1/16 has host bits set; write the network itself: 172.16.0.0/16"),
    (b"    name: x\n" + POOL + b"        gpus_per_node: 0\n",
     "nodePools[0].gpus_per_node: unknown key; write it as 'gpusPerNode' (stack files use the camelCase names only)"),
])
@pytest.mark.parametrize("command", ["validate", "explain"])
def test_bad_stack_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch, body: bytes, expected: str,
                                                command: str) -> None:
    code, output = run_main([command, str(stack_file(tmp_path, body))], capsys, monkeypatch)
    assert code == 2
    assert expected in output


def test_a_directory_given_as_the_stack_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "Pulumi.dir.yaml"
    folder.mkdir()
    code, output = run_main(["validate", str(folder)], capsys, monkeypatch)
    assert code == 2 and "is a directory, not a stack file" in output


def test_an_out_directory_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, output = run_main(["render", "local", "--out", str(blocker / "out")], capsys, monkeypatch)
    assert code == 2 and f"{blocker} is a file, not a directory; choose another --out" in output


def test_an_out_directory_that_cannot_be_created(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = run_main(["render", "local", "--out", "/proc/kilonode-cannot-exist/out"], capsys, monkeypatch)
    assert code == 2 and "cannot create /proc/kilonode-cannot-exist/out" in output


def test_an_unexpected_tool_failure_is_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that runs an external tool (the image build, verify) and sees it fail."""
    import kilonode.cli

    def broken() -> None:
        subprocess.run(["sh", "-c", "echo 'mmdebstrap: E: cannot reach the mirror' >&2; exit 3"],
                       check=True, capture_output=True)

    monkeypatch.setattr(kilonode.cli, "app", broken)
    code, output = run_main([], capsys, monkeypatch)
    assert code == 2
    assert "failed with exit status 3: mmdebstrap: E: cannot reach the mirror" in output


def _interrupted_at(module: str) -> subprocess.CompletedProcess[str]:
    """`kilonode validate local` with KeyboardInterrupt raised where `module` is first imported
    (as a Ctrl-C there would)."""
    script = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from kilonode.entry import main\n"
        "sys.argv = ['kilonode', 'validate', 'local']\n"
        "main()\n"
    )
    return subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


def test_ctrl_c_while_starting_up_prints_one_line() -> None:
    """While the CLI itself imports (typer): the console entry's one line."""
    result = _interrupted_at("typer")
    assert result.returncode == ExitCode.INTERRUPTED
    assert result.stderr.strip() == "kilonode: interrupted"


def test_ctrl_c_while_a_command_loads_exits_130_without_a_traceback() -> None:
    """Once the command runs (here: while its stack model imports, lazily), typer's own handling
    ends it, as a Ctrl-C at any later point of a command does: exit 130, no traceback."""
    result = _interrupted_at("pydantic")
    assert result.returncode == ExitCode.INTERRUPTED
    assert "Traceback" not in result.stderr
