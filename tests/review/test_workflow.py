""".github/workflows/infra-diff.yml cannot run here (no GitHub): its triggers, permissions and
steps are read from the file, and the command it runs is run, as written, in a test repository
with a high-risk commit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.paths import REPO_ROOT
from kilonode.review import alerting, snapcache
from kilonode.review.report import COMMENT_LIMIT, MARKER
from tests.review.conftest import edit_stack, git

assert REPO_ROOT is not None
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "infra-diff.yml"


def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def steps() -> dict[str, dict[str, Any]]:
    return {step.get("name", step.get("uses", "")): step for step in workflow()["jobs"]["diff"]["steps"]}


def test_it_runs_on_pull_requests_that_can_change_a_cluster() -> None:
    data = workflow()
    triggers = data[True] if True in data else data["on"]  # YAML 1.1 reads `on` as true
    paths = triggers["pull_request"]["paths"]
    assert {"stacks/**", "infra/**", "templates/**", "sysctl/**", "node-image/**"} <= set(paths)
    assert data["permissions"] == {"contents": "read", "pull-requests": "write"}
    checkout = next(s for s in data["jobs"]["diff"]["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0, "the base branch's commits are needed for its worktree"


def test_the_comment_is_updated_not_duplicated() -> None:
    script = steps()["Comment (one per pull request, updated)"]["with"]["script"]
    assert f"'{MARKER}'" in script and "updateComment" in script and "createComment" in script
    assert script.index("updateComment") < script.index("createComment")


def test_the_snapshots_are_kept_where_the_review_reads_them() -> None:
    """The cache step's path is snapcache's directory under the runner's default cache home
    (no XDG_CACHE_HOME on GitHub's runners), restored by the base commit first."""
    cache = steps()["Keep the snapshots"]
    assert str(cache["uses"]).startswith("actions/cache@")
    assert cache["with"]["path"] == f"~/.cache/kilonode/{snapcache.KIND}"
    assert "XDG_CACHE_HOME" not in json.dumps(workflow())
    key, restore = cache["with"]["key"], cache["with"]["restore-keys"].splitlines()
    assert "github.event.pull_request.base.sha" in restore[0] and key.startswith(restore[0])
    names = list(steps())
    assert names.index("Install kilonode") < names.index("Keep the snapshots") < names.index("kilonode diff")


def test_the_alert_rules_are_checked_by_a_promtool_the_diff_finds() -> None:
    """kilonode.review.alerting finds promtool through $KILONODE_PROMTOOL: the step before the
    diff unpacks the distribution's and names it there (never installing the server package)."""
    names = list(steps())
    step = steps()["promtool for the alert rules"]
    assert names.index("promtool for the alert rules") < names.index("kilonode diff")
    assert f"{alerting.PROMTOOL_ENV}=" in step["run"] and "$GITHUB_ENV" in step["run"]
    assert "apt-get download prometheus" in step["run"] and "apt-get install" not in step["run"]


@pytest.mark.slow
def test_the_workflow_command_reports_and_flags_a_high_risk(repo: Path) -> None:
    run = steps()["kilonode diff"]["run"]
    [command] = [line.strip() for line in run.splitlines() if line.strip().startswith("kilonode diff")]
    assert "--fail-on high" in command and "--format md" in command
    git(repo, "checkout", "-q", "-B", "pr", "main")
    try:
        edit_stack("research-7500", lambda c: c["etcd"]["main"].update({"vmSize": "Standard_D32ds_v5"}))(repo)
        git(repo, "commit", "-q", "-am", "bigger etcd VMs")
        git(repo, "update-ref", "refs/remotes/origin/main", "main")  # what checkout's fetch-depth 0 gives
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # kilonode, as pip installs it
        env = {**os.environ, "BASE_REF": "main", "PATH": path}
        done = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 3, done.stderr
        comment = (repo / "comment.md").read_text()
        assert comment.startswith(MARKER) and len(comment) < COMMENT_LIMIT
        assert re.search(r"etcd-quorum.*5 of 5 etcd-main members", comment)
        assert json.loads((repo / "diff.json").read_text())["level"] == "high"
    finally:
        for name in ("comment.md", "diff.json"):
            (repo / name).unlink(missing_ok=True)
        git(repo, "checkout", "-q", "main")
