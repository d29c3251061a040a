"""etcd-config: every etcd member's rendered flags pass the checks etcd runs before it starts.

etcd validates its configuration before it opens its data dir and exits on the first rule
broken ("failed to verify flags: ..."): etcd server/embed/config.go, Config.Validate, with
`maxElectionMs = 50000` beside it (read at etcd main and in the 3.4 tree, embed/config.go, the
same rules and messages; the pinned release, node-image/binaries.toml, is 3.5.33, between them).
A member whose unit breaks one never starts, and the control-plane roll that replaces the
members with that unit takes them down one by one: past the first, quorum is gone (the
independent trace 12a of kilonode diff on research-7500: `--heartbeat-interval=300
--election-timeout=1000` added to the etcd unit was reviewed as the usual member replacement).

Read from each etcd host's rendered unit (etc/systemd/system/etcd.service, kilonode.render.etcd
etcd_flags); a flag the unit leaves out takes etcd's default (embed NewConfig: TickMs 100,
ElectionMs 1000). Each is a break:
- --heartbeat-interval or --election-timeout not a positive whole number of milliseconds
  ("must be >0"; a value that is no number fails etcd's flag parsing first);
- --election-timeout below 5 x --heartbeat-interval ("--election-timeout[...] should be at
  least as 5 times as --heartbeat-interval[...]");
- --election-timeout above 50000 ms ("is too long, and should be set less than 50000ms");
- --auto-compaction-mode other than periodic or revision ("unknown auto-compaction-mode").
"""

from __future__ import annotations

from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import flags_of, unit_exec_args

NAME = "etcd-config"
TITLE = "every etcd member's flags pass etcd's own start-up validation"

UNIT = "etc/systemd/system/etcd.service"
HEARTBEAT = "heartbeat-interval"
ELECTION = "election-timeout"
COMPACTION_MODE = "auto-compaction-mode"
# etcd server/embed/config.go NewConfig (TickMs, ElectionMs) and maxElectionMs
DEFAULTS_MS = {HEARTBEAT: 100, ELECTION: 1000}
MAX_ELECTION_MS = 50000
ELECTION_TICKS = 5  # Validate: 5*TickMs > ElectionMs is refused
COMPACTION_MODES = ("periodic", "revision")  # v3compactor.ModePeriodic, ModeRevision
SOURCE = "etcd server/embed/config.go Config.Validate"


def unit_flags(text: str) -> dict[str, str]:
    """The unit's ExecStart flags: name -> value (the last one given wins, as in etcd's flag set), read as
    every preflight check reads a unit (kilonode.preflight.nodes); a line that does not split has none."""
    try:
        return flags_of(unit_exec_args(text))
    except ValueError:
        return {}


def _ms(flags: dict[str, str], name: str) -> int | str:
    """The flag's milliseconds (etcd's default when absent), or the text that is no whole number."""
    text = flags.get(name)
    if text is None:
        return DEFAULTS_MS[name]
    return int(text) if text.isdigit() else text


def problems(flags: dict[str, str]) -> list[str]:
    """What etcd's Validate (or its flag parsing) refuses in these flags, each with etcd's words."""
    found = []
    tick, election = _ms(flags, HEARTBEAT), _ms(flags, ELECTION)
    for name, value in ((HEARTBEAT, tick), (ELECTION, election)):
        if isinstance(value, str):
            found.append(f"--{name}={value!r} is no whole number of milliseconds: etcd's flag parsing refuses it")
        elif value <= 0:
            found.append(f"--{name} must be >0 (set to {value}ms)")
    if isinstance(tick, int) and isinstance(election, int) and tick > 0 and election > 0:
        if ELECTION_TICKS * tick > election:
            found.append(f"--election-timeout[{election}ms] should be at least as {ELECTION_TICKS} times as "
                         f"--heartbeat-interval[{tick}ms]")
        if election > MAX_ELECTION_MS:
            found.append(f"--election-timeout[{election}ms] is too long, and should be set less than "
                         f"{MAX_ELECTION_MS}ms")
    mode = flags.get(COMPACTION_MODE, "")
    if mode and mode not in COMPACTION_MODES:
        found.append(f"unknown auto-compaction-mode {mode!r}")
    return found


def check(inputs: Inputs) -> list[Finding]:
    findings = []
    for host in inputs.hosts():
        text = inputs.host_files(host).get(UNIT)
        if not host.startswith("etcd-") or text is None:
            continue
        flags = unit_flags(text)
        for problem in problems(flags):
            set_ = ", ".join(f"--{n}={flags[n]}" for n in (HEARTBEAT, ELECTION) if n in flags) or "defaults"
            findings.append(Finding(
                NAME, "break", host,
                f"etcd refuses to start ({SOURCE}: {problem}): the member never serves, and every member the "
                "control-plane roll replaces with this unit stays down; past the cluster's tolerance quorum is "
                f"lost and every write stops (unit flags: {set_})",
                f"in {host}/{UNIT} (kilonode.render.etcd etcd_flags): keep --election-timeout at least "
                f"{ELECTION_TICKS} x --heartbeat-interval and at most {MAX_ELECTION_MS} ms (etcd's tuning guide: "
                "heartbeat about the round trip between members, election timeout about 10 x it; defaults "
                f"{DEFAULTS_MS[HEARTBEAT]}/{DEFAULTS_MS[ELECTION]}), auto-compaction-mode periodic or revision",
            ))
    return findings
