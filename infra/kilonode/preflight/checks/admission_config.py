"""admission-config: every admission plugin an apiserver enables is one kube-apiserver knows and can
start, with the configuration it needs.

kube-apiserver builds its admission chain at start, before it serves (k8s.io/apiserver at
kubernetes-1.34.2: pkg/server/options/admission.go Validate and ApplyTo, pkg/admission/plugins.go
InitPlugin), and exits on the first plugin it cannot build. A plugin in --enable-admission-plugins
(or --disable-admission-plugins) that no plugin registered is a flag error (`enable-admission-plugins
plugin "X" is unknown`); a plugin whose factory fails is `couldn't init admission plugin "X"`. Some
plugins fail on no configuration: a plugin with no `plugins[]` entry in the file
--admission-control-config-file names, or with no such flag, gets a nil reader (pkg/admission/config.go
ConfigFor), and EventRateLimit's LoadConfiguration(nil) yields a Configuration whose limits are empty,
which its ValidateConfiguration refuses ("limits: ... must not be empty": kubernetes/kubernetes#62861);
ImagePolicyWebhook returns "no config specified". Either way the apiserver never serves, and every
apiserver the control-plane roll replaces with that unit stays down: with all of them, the cluster has
no API. A CIS hardening step (EventRateLimit, CIS 1.2.9) added as a flag alone does exactly this.

Read from each apiserver's rendered kube-apiserver unit (kilonode.render.control_plane
apiserver_flags) and the admission configuration file it names (rendered beside it), against the
catalogue (kilonode.catalog admission_plugins.yaml: the in-tree names at the pinned version and the
plugins that require configuration, each with its upstream source). Each is a break:
- a name kube-apiserver does not know at that version, or a name both enabled and disabled;
- a plugin that requires configuration, enabled without its entry (or without the flag), or with an
  entry upstream refuses: EventRateLimit's apiVersion eventratelimit.admission.k8s.io/v1alpha1, kind
  Configuration and a non-empty `limits` (each of type Server, Namespace, User or SourceAndObject,
  qps and burst positive);
- the file the flag names missing from the render, or not an AdmissionConfiguration
  (apiserver.config.k8s.io/v1) nor the legacy `imagePolicy` document; an entry whose `path` is not
  rendered on the host.

A name the catalogue's newer source registers but no 1.34 source read here confirms is a warning, as
is any unknown name at a Kubernetes version other than the catalogue's (its list is that version's).
Not judged: the deprecated --admission-control flag; plugins that start on defaults (PodNodeSelector,
PodTolerationRestriction, PodSecurity, ResourceQuota, the webhooks) whatever their entry holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.catalog.admission_plugins import AdmissionPlugins, RequiresConfig, catalogue
from kilonode.preflight.model import Finding, Inputs, Level
from kilonode.yamlio import load_yaml

NAME = "admission-config"
TITLE = "every admission plugin an apiserver enables is known and has the configuration it needs to start"

UNIT = "etc/systemd/system/kube-apiserver.service"
ENABLE, DISABLE, CONFIG = "--enable-admission-plugins", "--disable-admission-plugins", "--admission-control-config-file"
ADMISSION_KINDS = {("apiserver.config.k8s.io/v1", "AdmissionConfiguration"),
                   ("apiserver.config.k8s.io/v1alpha1", "AdmissionConfiguration")}
_FLAG = re.compile(r"(--(?:enable|disable)-admission-plugins|--admission-control-config-file)=(\S*)")
DOWN = ("kube-apiserver exits at start, before it serves: this apiserver never comes up, and each apiserver the "
        "control-plane roll replaces with this unit stays down (with all of them, the cluster has no API)")


def flags(unit: str) -> dict[str, str]:
    """The admission flags of a rendered kube-apiserver unit: flag -> value (absent: not set)."""
    return {flag: value.rstrip("\\").strip("'\"") for flag, value in _FLAG.findall(unit)}


def names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def check(inputs: Inputs) -> list[Finding]:
    known = catalogue()
    findings: list[Finding] = []
    for host in inputs.hosts():
        files = inputs.host_files(host)
        if UNIT not in files:
            continue
        found = flags(files[UNIT])
        enabled, disabled = names(found.get(ENABLE)), names(found.get(DISABLE))
        findings += _names(host, enabled, disabled, known, inputs.plan.kubernetes_version)
        entries, problem = _entries(files, found.get(CONFIG))
        if problem:
            findings.append(_break(host, problem, f"render the file {CONFIG} names on every apiserver, an "
                                   "AdmissionConfiguration (apiserver.config.k8s.io/v1) (kilonode.render."
                                   "control_plane admission_config)"))
            continue
        for plugin in enabled:
            need = known.required(plugin)
            if need is not None and plugin not in disabled:
                findings += _configured(host, need, entries, found.get(CONFIG), files)
    return findings


def _break(host: str, what: str, fix: str, level: Level = "break") -> Finding:
    return Finding(NAME, level, host, what, fix)


def _names(host: str, enabled: list[str], disabled: list[str], known: AdmissionPlugins,
           version: str) -> list[Finding]:
    findings = []
    same = _minor(version) == _minor(known.kubernetes_version)
    for flag, listed in ((ENABLE, enabled), (DISABLE, disabled)):
        for plugin in listed:
            if plugin in known.plugins:
                continue
            if plugin in known.unconfirmed:
                findings.append(_break(host, (
                    f"{flag} names {plugin}, which newer kube-apiserver source registers but no source read for "
                    f"{known.kubernetes_version} confirms: if kube-apiserver {version} does not know it, flag "
                    f"validation fails (`{flag.lstrip('-')} plugin \"{plugin}\" is unknown`) and {DOWN}"),
                    f"check that kube-apiserver {version} lists {plugin} (`kube-apiserver -h`, --admission-control); "
                    "if not, remove it from the flag", level="warn"))
                continue
            findings.append(_break(host, (
                f"{flag} names {plugin}, which kube-apiserver "
                + (f"{version} does not know" if same else
                   f"{known.kubernetes_version} does not know (the catalogue's list; this stack runs {version})")
                + f": flag validation fails (`{flag.lstrip('-')} plugin \"{plugin}\" is unknown`, "
                "k8s.io/apiserver pkg/server/options/admission.go Validate) and " + DOWN),
                f"remove {plugin} from {flag}, or spell it as kube-apiserver does (one of "
                "infra/kilonode/catalog/admission_plugins.yaml `plugins`)", level="break" if same else "warn"))
    for plugin in sorted(set(enabled) & set(disabled)):
        findings.append(_break(host, (
            f"{plugin} is in both {ENABLE} and {DISABLE}: flag validation fails (\"[{plugin}] in "
            f"enable-admission-plugins and disable-admission-plugins overlapped\") and {DOWN}"),
            f"name {plugin} in one of the two flags only"))
    return findings


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _entries(files: Mapping[str, str], path: str | None) -> tuple[dict[str, Any], str]:
    """The admission configuration's entries by plugin name ({} without the flag), or what keeps
    kube-apiserver from reading the file (k8s.io/apiserver pkg/admission/config.go
    ReadAdmissionConfiguration: an unreadable file or one that decodes to neither an
    AdmissionConfiguration nor a legacy imagePolicy/podNodeSelectorPluginConfig document fails with
    "failed to read plugin config")."""
    if not path:
        return {}, ""
    text = files.get(path.lstrip("/"))
    if text is None:
        return {}, (f"{CONFIG}={path}, but no such file is rendered on this host: kube-apiserver cannot read it "
                    f"(\"unable to read admission control configuration\") and {DOWN}")
    try:
        document = load_yaml(text) or {}
    except yaml.YAMLError as error:
        return {}, f"{path} is not YAML ({error}); kube-apiserver cannot decode it and {DOWN}"
    if not isinstance(document, dict):
        return {}, f"{path} is not a YAML mapping; kube-apiserver cannot decode it and {DOWN}"
    if (document.get("apiVersion"), document.get("kind")) in ADMISSION_KINDS:
        entries = {}
        for entry in document.get("plugins") or []:
            if isinstance(entry, dict) and entry.get("name"):
                entries[str(entry["name"])] = entry
        return entries, ""
    if "imagePolicy" in document or "podNodeSelectorPluginConfig" in document:
        # The legacy form: the whole file is ImagePolicyWebhook's and PodNodeSelector's configuration.
        return {name: {"name": name, "configuration": document}
                for name in ("ImagePolicyWebhook", "PodNodeSelector")}, ""
    return {}, (f"{path} is neither an AdmissionConfiguration (apiVersion apiserver.config.k8s.io/v1) nor a legacy "
                f"imagePolicy document: kube-apiserver fails \"failed to read plugin config\" and {DOWN}")


def _configured(host: str, need: RequiresConfig, entries: Mapping[str, Any], path: str | None,
                files: Mapping[str, str]) -> list[Finding]:
    """A break where `need.name` starts without what it requires, else none."""
    entry = entries.get(need.name)
    wanted = (f"apiVersion: {need.api_version}, kind: {need.kind}, " if need.api_version else "") + need.example
    fix = (f"add the plugin's entry to the AdmissionConfiguration {path or 'that ' + CONFIG + ' must name'} "
           "(kilonode.render.control_plane admission_config): "
           f"`plugins: [{{name: {need.name}, configuration: {{{wanted}}}}}]` "
           + ("" if path else f"and set {CONFIG} on every apiserver ")
           + f"({need.source[0].split(' (')[0]}); or leave {need.name} out of {ENABLE}")
    if entry is None:
        where = f"the file {CONFIG} names ({path}) has no entry for it" if path else f"there is no {CONFIG}"
        return [_break(host, f"{ENABLE} names {need.name}, and {where}: {need.why}; {DOWN}", fix)]
    config: Any = entry.get("configuration")
    if config is None and entry.get("path"):
        text = files.get(str(entry["path"]).lstrip("/"))
        if text is None:
            return [_break(host, (f"the {need.name} entry's path {entry['path']} is not rendered on this host: "
                                  f"kube-apiserver exits reading it (klog.Fatalf, pkg/admission/config.go "
                                  f"GetAdmissionPluginConfigurationFor); {DOWN}"), fix)]
        try:
            config = load_yaml(text)
        except yaml.YAMLError:
            config = None
    problem = _refused(need, config)
    if problem:
        return [_break(host, f"{need.name}'s configuration is refused: {problem}; so {need.why}; {DOWN}", fix)]
    return []


def _refused(need: RequiresConfig, config: Any) -> str:
    """What the plugin refuses in its configuration ('' when it takes it)."""
    if not isinstance(config, dict):
        return "the entry holds no configuration"
    if need.name == "ImagePolicyWebhook":
        policy = config.get("imagePolicy")
        return "" if isinstance(policy, dict) and policy.get("kubeConfigFile") else "no imagePolicy.kubeConfigFile"
    if (config.get("apiVersion"), config.get("kind")) != (need.api_version, need.kind):
        return (f"apiVersion {config.get('apiVersion')!r} and kind {config.get('kind')!r}, not "
                f"{need.api_version} {need.kind} (the plugin's decoder knows no other)")
    if not need.limit_types:
        return ""
    limits = config.get("limits")
    if not isinstance(limits, list) or not limits:
        return "limits is empty (ValidateConfiguration: \"must not be empty\")"
    for index, limit in enumerate(limits):
        limit = limit if isinstance(limit, dict) else {}
        if limit.get("type") not in need.limit_types:
            return f"limits[{index}].type {limit.get('type')!r} is not one of {', '.join(need.limit_types)}"
        for field in ("qps", "burst"):
            value = limit.get(field)
            if not isinstance(value, int | float) or value <= 0:
                return f"limits[{index}].{field} must be positive"
        if limit.get("type") != "Server" and (limit.get("cacheSize") or 0) < 0:
            return f"limits[{index}].cacheSize must not be negative"
    return ""
