"""kilonode's policy pack: the invariants of kilonode.review.rules, enforced by
`pulumi preview --policy-pack policy` (and `pulumi up`) before anything reaches Azure.

Nothing here defines a rule. Each invariant (`rules.INVARIANTS`) becomes one mandatory stack
policy of the same name and description; its validation turns the resources pulumi-policy
hands over into `rules.Resource` (type, logical name, properties, the protect option), runs the
shared check, and reports each sentence it returns, with the URN of the resource the sentence
starts with. `kilonode diff` reports the same rules as high risks.

Values not known at preview (an address Azure assigns, an ID) reach a policy as pulumi-policy's
unknown sentinels behind proxies that raise `UnknownValueError` when read; the pack reads them
as absent instead, which the checks treat as "nothing to check", so no policy is skipped for a
whole stack because one property is unknown.

Pulumi runs this file as `__main__` (`runpy.run_path(..., run_name="__main__")`); the pack's gRPC
server starts only then. Imported under another name (the tests), it only builds `POLICIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    PolicyResource,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import (
    UNKNOWN_ARCHIVE_VALUE,
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_ASSET_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    UnknownValueError,
)

from kilonode.review import rules

PACK_NAME = "kilonode"

# What the engine sends for a value computed during the update (pulumi_policy.proxy); behind
# the proxies reading one raises UnknownValueError, unproxied it is the bare sentinel string.
UNKNOWN_SENTINELS = frozenset({
    UNKNOWN_BOOLEAN_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_STRING_VALUE, UNKNOWN_ARRAY_VALUE,
    UNKNOWN_ASSET_VALUE, UNKNOWN_ARCHIVE_VALUE, UNKNOWN_OBJECT_VALUE,
})

_ABSENT = object()


def _is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


def _read(container: Any, key: Any) -> Any:
    """container[key], or _ABSENT when the value is not known yet."""
    try:
        value = container[key]
    except UnknownValueError:
        return _ABSENT
    return _ABSENT if _is_unknown(value) else value


class Known(Mapping[str, Any]):
    """A read-only view of properties in which values not known yet are absent: `get` returns
    its default for them, `in` is False, iteration skips them. Nested mappings are viewed the
    same way, lazily (a CRD's schema is never walked); lists become lists of their known items."""

    __slots__ = ("_target",)

    def __init__(self, target: Mapping[str, Any]) -> None:
        self._target = target

    def __getitem__(self, key: str) -> Any:
        value = _read(self._target, key)
        if value is _ABSENT:
            raise KeyError(key)
        return known(value)

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._target if _read(self._target, key) is not _ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Known({dict(self)!r})"


def known(value: Any) -> Any:
    """`value` with what is not known yet left out (see Known)."""
    if isinstance(value, Mapping):
        return value if isinstance(value, Known) else Known(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = (_read(value, i) for i in range(len(value)))
        return [known(item) for item in items if item is not _ABSENT]
    return value


def resource(r: PolicyResource) -> rules.Resource:
    """A resource as pulumi-policy gives it to a stack policy, as the shared rules read it."""
    return rules.Resource(type=r.resource_type, name=r.name, props=Known(r.props),
                          protect=bool(r.opts is not None and r.opts.protect))


def _urns(resources: Sequence[PolicyResource]) -> dict[str, str]:
    """Logical name -> URN, for the names only one resource has."""
    seen: dict[str, str | None] = {}
    for r in resources:
        seen[r.name] = None if r.name in seen else r.urn
    return {name: urn for name, urn in seen.items() if urn}


def urn_of(message: str, urns: Mapping[str, str]) -> str | None:
    """The URN of the resource a violation is about: the rules start such a sentence with its
    name ("<vm>: ...", "<nsg> rule ..."); one about a group or the stack has none."""
    first = message.split(" ", 1)[0].removesuffix(":")
    return urns.get(first)


StackValidation = Callable[[StackValidationArgs, ReportViolation], None]


def validation(invariant: rules.Invariant) -> StackValidation:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        urns = _urns(args.resources)
        for message in invariant.check([resource(r) for r in args.resources]):
            report_violation(message, urn_of(message, urns))

    validate.__name__ = f"validate_{invariant.name.replace('-', '_')}"
    return validate


POLICIES: list[StackValidationPolicy] = [
    StackValidationPolicy(
        name=invariant.name,
        description=invariant.description,
        validate=validation(invariant),
        enforcement_level=EnforcementLevel.MANDATORY,
    )
    for invariant in rules.INVARIANTS
]


def main() -> None:
    """Serve the pack to the Pulumi engine (blocks until the engine stops it)."""
    PolicyPack(name=PACK_NAME, policies=list(POLICIES), enforcement_level=EnforcementLevel.MANDATORY)


if __name__ == "__main__":
    main()
