"""Problems found in a stack: one line each, naming the file, the field and what to do."""

from __future__ import annotations

from dataclasses import dataclass

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    """('nodePools', 0, 'podsPerNode') -> 'nodePools[0].podsPerNode'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def undotted(path: str) -> Loc:
    """'nodePools[0].podsPerNode' -> ('nodePools', 0, 'podsPerNode'): the inverse of dotted."""
    loc: list[str | int] = []
    for part in path.replace("[", ".[").split("."):
        if part.startswith("["):
            loc.append(int(part[1:-1]))
        elif part:
            loc.append(part)
    return tuple(loc)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a stack: where (`loc`, user-facing camelCase keys) and what."""

    loc: Loc
    message: str
    line: int | None = None

    @property
    def path(self) -> str:
        return dotted(self.loc)

    def format(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        return f"{where}: {self.path or '(top level)'}: {self.message}"


class StackError(Exception):
    """A stack could not be loaded, validated or planned; carries every problem found."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = problems
        super().__init__("\n".join(p.format(file) for p in problems))


class PlanError(Exception):
    """Raised by the pure planner, which knows no file; the loader adds file and lines."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{p.path}: {p.message}" for p in problems))


class BuildError(RuntimeError):
    """A machine image (or what it is built from, such as the pinned binaries) cannot be made."""


# The most a refusal shows of its problems, in bytes: a hostile file can hold thousands (each
# problem is one line, and quotes at most ~80 characters of a value).
MAX_PROBLEM_BYTES = 3072


def shown_lines(lines: list[str], limit: int = MAX_PROBLEM_BYTES) -> tuple[list[str], int]:
    """The problem lines a refusal prints, at most `limit` bytes of them, and how many are left
    out: every command and the Pulumi program show a stack's problems the same way."""
    shown: list[str] = []
    budget = limit
    for line in lines:
        budget -= len(line.encode()) + 1
        if budget < 0:
            break
        shown.append(line)
    return shown, len(lines) - len(shown)


def report(error: StackError) -> str:
    """A stack's problems as one bounded text: a header, one line per problem, how many more."""
    lines, hidden = shown_lines([p.format(error.file) for p in error.problems])
    count = len(error.problems)
    header = f"kilonode: {count} problem{'s' * (count != 1)} in {error.file}; nothing was written"
    more = [f"kilonode: {hidden} more not shown; fix these and run again"] if hidden else []
    return "\n".join([header, *lines, *more])
