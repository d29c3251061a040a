"""admission-config: the shipped stacks' apiservers start every admission plugin they enable; a
plugin that needs configuration enabled without it (EventRateLimit, the CIS 1.2.9 step, as a flag
alone), a name kube-apiserver does not know, and an unreadable configuration file are breaks.

No stack key sets the apiservers' admission plugins (kilonode.config.model: the flags are
kilonode.render.control_plane's), so each break is planted in the rendered unit and configuration
file, as a change to the renderer would render them."""

from __future__ import annotations

import pytest
import yaml

from kilonode.catalog.admission_plugins import catalogue
from kilonode.preflight import run
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

UNIT = "etc/systemd/system/kube-apiserver.service"
CONFIG = "etc/kubernetes/admission-config.yaml"
SHIPPED = "--enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs"
EVENT_LIMITS = {"apiVersion": "eventratelimit.admission.k8s.io/v1alpha1", "kind": "Configuration",
                "limits": [{"type": "Server", "qps": 5000, "burst": 20000},
                           {"type": "Namespace", "qps": 50, "burst": 100, "cacheSize": 2000}]}


def enable(files: dict[str, str], plugins: str) -> list[str]:
    """Every apiserver's unit with `plugins` added to --enable-admission-plugins; the hosts."""
    hosts = []
    for path in [p for p in files if p.endswith(UNIT)]:
        assert SHIPPED in files[path]
        files[path] = files[path].replace(SHIPPED, f"{SHIPPED},{plugins}")
        hosts.append(path.split("/", 1)[0])
    return sorted(hosts)


def add_entry(files: dict[str, str], name: str, configuration: object) -> None:
    for path in [p for p in files if p.endswith(CONFIG)]:
        document = yaml.safe_load(files[path])
        document["plugins"].append({"name": name, "configuration": configuration})
        files[path] = yaml.safe_dump(document)


def found(stack: str, files: dict[str, str]) -> list[tuple[str, str, str, str]]:
    return [(f.level, f.where, f.what, f.fix) for f in run(inputs_of(stack, files=files), ["admission-config"])]


def test_the_shipped_stacks_apiservers_start_every_plugin_they_enable(shipped: str) -> None:
    assert found(shipped, artefacts(shipped)[0]) == []


def test_event_rate_limit_without_its_configuration_keeps_every_apiserver_down() -> None:
    files, _ = artefacts("research-7500")
    hosts = enable(files, "EventRateLimit")
    breaks = found("research-7500", files)
    assert [(level, where) for level, where, _, _ in breaks] == [("break", h) for h in hosts] and len(hosts) == 5
    _, _, what, fix = breaks[0]
    assert "has no entry for it" in what and "limits" in what and "must not be empty" in what
    assert "couldn't init admission plugin" in what and "exits at start" in what and "stays down" in what
    assert "eventratelimit.admission.k8s.io/v1alpha1" in fix and "kind: Configuration" in fix


def test_event_rate_limit_with_its_configuration_starts() -> None:
    files, _ = artefacts("research-7500")
    enable(files, "EventRateLimit")
    add_entry(files, "EventRateLimit", EVENT_LIMITS)
    assert found("research-7500", files) == []


@pytest.mark.parametrize(("configuration", "said"), [
    ({**EVENT_LIMITS, "limits": []}, "limits is empty"),
    ({**EVENT_LIMITS, "kind": "EventRateLimitConfiguration"}, "the plugin's decoder knows no other"),
    ({**EVENT_LIMITS, "limits": [{"type": "Cluster", "qps": 1, "burst": 1}]}, "is not one of Server"),
    ({**EVENT_LIMITS, "limits": [{"type": "Server", "qps": 0, "burst": 1}]}, "qps must be positive"),
])
def test_event_rate_limit_with_a_configuration_it_refuses_is_a_break(configuration: dict[str, object],
                                                                     said: str) -> None:
    files, _ = artefacts("local")
    enable(files, "EventRateLimit")
    add_entry(files, "EventRateLimit", configuration)
    [(level, where, what, _)] = found("local", files)
    assert (level, where) == ("break", "apiserver-0") and said in what


def test_without_the_config_file_flag_every_plugin_that_needs_one_breaks() -> None:
    files, _ = artefacts("local")
    enable(files, "EventRateLimit,ImagePolicyWebhook")
    files["apiserver-0/" + UNIT] = files["apiserver-0/" + UNIT].replace(
        "--admission-control-config-file=/etc/kubernetes/admission-config.yaml", "")
    whats = [what for _, _, what, _ in found("local", files)]
    assert len(whats) == 2 and all("there is no --admission-control-config-file" in w for w in whats)
    assert any("no config specified" in w for w in whats)


def test_plugins_that_default_without_configuration_start() -> None:
    files, _ = artefacts("local")
    enable(files, "PodNodeSelector,PodTolerationRestriction,AlwaysPullImages,EventRateLimit")
    add_entry(files, "EventRateLimit", EVENT_LIMITS)
    assert found("local", files) == []


def test_an_unknown_plugin_name_keeps_the_apiserver_down() -> None:
    """SecurityContextDeny: an older CIS benchmark's step, no longer an in-tree plugin."""
    files, _ = artefacts("local")
    enable(files, "SecurityContextDeny")
    [(level, where, what, fix)] = found("local", files)
    assert (level, where) == ("break", "apiserver-0")
    assert 'enable-admission-plugins plugin "SecurityContextDeny" is unknown' in what and "stays down" in what
    assert "remove SecurityContextDeny" in fix


def test_a_name_newer_source_registers_is_a_warning() -> None:
    files, _ = artefacts("local")
    enable(files, catalogue().unconfirmed[0])
    [(level, _, what, _)] = found("local", files)
    assert level == "warn" and "no source read for 1.34.2 confirms" in what


def test_a_plugin_enabled_and_disabled_and_a_missing_config_file_are_breaks() -> None:
    files, _ = artefacts("local")
    unit = "apiserver-0/" + UNIT
    files[unit] = files[unit].replace(SHIPPED, f"{SHIPPED} --disable-admission-plugins=NodeRestriction")
    del files["apiserver-0/" + CONFIG]
    whats = [what for _, _, what, _ in found("local", files)]
    assert any("overlapped" in w for w in whats)
    assert any("no such file is rendered" in w for w in whats)


def test_the_catalogue_cites_each_plugin_that_requires_configuration() -> None:
    known = catalogue()
    assert {r.name for r in known.requires_config} == {"EventRateLimit", "ImagePolicyWebhook"}
    assert all(r.name in known.plugins and r.source for r in known.requires_config)
    assert not set(known.plugins) & set(known.unconfirmed)


def test_the_event_rate_limit_pull_request_is_a_new_preflight_break_in_the_review() -> None:
    """The independent trace's pull request on research-7500 (CIS 1.2.9: EventRateLimit added to every
    apiserver's flags, no configuration): admission-plugins-changed calls it a medium restart; the
    review's preflight-break, running this check on both sides, reports the head's new break high."""
    from kilonode.review.compare import compare_stack
    from kilonode.review.finding import HIGH
    from kilonode.review.risks import assess
    from tests.review.snapshots import snapshot

    head = snapshot("research-7500")
    hosts = enable(head["files"], "EventRateLimit")
    risks = assess(compare_stack("research-7500", snapshot("research-7500"), head), {})
    [line] = [r for r in risks if r.rule == "preflight-break" and "admission-config" in r.summary]
    assert line.level == HIGH and sorted(line.subjects) == hosts
    assert "EventRateLimit" in line.summary and "stays down" in line.summary
    assert "eventratelimit.admission.k8s.io/v1alpha1" in line.summary
