"""The flags of the control plane's programs as their rendered systemd units give them: one reader
for every review rule that judges a flag (control_flags, value_effects, lifecycle), and the same
reader as preflight's (kilonode.preflight.nodes), so that the review and preflight read a unit alike."""

from __future__ import annotations

from collections.abc import Mapping

from kilonode.preflight.nodes import flags_of, unit_exec_args

UNITS = {
    "kube-apiserver": "etc/systemd/system/kube-apiserver.service",
    "kube-controller-manager": "etc/systemd/system/kube-controller-manager.service",
    "kube-scheduler": "etc/systemd/system/kube-scheduler.service",
}


def unit_flags(text: str) -> dict[str, str]:
    """The flags of a unit's ExecStart, name -> value ('true' for a bare flag; the last one wins, as pflag):
    preflight's reader (kilonode.preflight.nodes), so that the review and preflight read a unit alike. A unit
    whose ExecStart does not split as a shell line (an unbalanced quote: systemd refuses it too) has none."""
    try:
        return flags_of(unit_exec_args(text))
    except ValueError:
        return {}


def program_flags(files: Mapping[str, str]) -> dict[str, dict[str, dict[str, str]]]:
    """program -> apiserver host -> its flags."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    for path, text in files.items():
        for program, unit in UNITS.items():
            if path.endswith("/" + unit):
                found.setdefault(program, {})[path.split("/", 1)[0]] = unit_flags(text)
    return found
