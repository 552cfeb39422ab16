#!/usr/bin/env python3
"""Helpers of scripts/check-helm.sh for the chart's Prometheus rules (PyYAML from its venv).

    check-alerts.py rules-file CRDS_YAML OUT_RULES OUT_UNANNOTATED
        The rendered PrometheusRules (alerts, recording rules) as one Prometheus rule file (for `promtool check rules`),
        and a copy without annotations for `promtool test rules`: promtool compares an
        alert's annotations whole, and the descriptions are runbook text, so the unit tests
        pin when each alert fires and with which labels, and `annotations` below checks
        the text.
    check-alerts.py annotations RULES README
        Every alert has a summary, a description and a runbook_url ending in
        `#<alert name in lower case>`, and the chart README has that section.
    check-alerts.py recorded RULES DASHBOARD...
        Every recorded series (`namespace_pod:...:rate`) a dashboard reads is written by a
        recording rule of RULES.
    check-alerts.py coverage RULES TEST_FILE...
        Every alert of RULES is expected to fire in some test case and expected silent in
        some (other) evaluation, so no alert goes untested and none passes by never firing.
"""

import pathlib
import re
import sys

import yaml

from check_helm_common import fail, load_docs


def rules_file(crds, out, out_unannotated):
    docs = load_docs(crds)
    rules = [d for d in docs if d.get("kind") == "PrometheusRule"]
    if not rules:
        fail(f"{crds}: no PrometheusRule")
    groups = [group for rule in rules for group in rule["spec"]["groups"]]
    pathlib.Path(out).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    pathlib.Path(out_unannotated).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    alerts = [r["alert"] for g in groups for r in g["rules"] if "alert" in r]
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    print(f"{len(alerts)} alerts and {len(records)} recording rules in {len(groups)} groups")


def alerts_of(rules):
    with open(rules) as f:
        groups = yaml.safe_load(f)["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def github_anchor(heading):
    """The id GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def annotations(rules, readme):
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in pathlib.Path(readme).read_text().splitlines()
        if line.startswith("#")
    }
    errors = []
    alerts = alerts_of(rules)
    for rule in alerts:
        name = rule["alert"]
        notes = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not str(notes.get(key, "")).strip():
                errors.append(f"{name}: no {key}")
        url = str(notes.get("runbook_url", ""))
        anchor = url.rpartition("#")[2]
        if anchor != name.lower():
            errors.append(f"{name}: runbook_url {url!r} does not end in #{name.lower()}")
        elif anchor not in anchors:
            errors.append(f"{name}: {readme} has no section #{anchor}")
    if errors:
        fail("\n".join(errors))
    print(f"{len(alerts)} alerts with summary, description and a runbook section")


def coverage(rules, tests):
    names = [r["alert"] for r in alerts_of(rules)]
    fires, silent = set(), set()
    for path in tests:
        with open(path) as f:
            for case in yaml.safe_load(f).get("tests", []):
                for check in case.get("alert_rule_test", []):
                    (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    errors = []
    for name in names:
        if name not in fires:
            errors.append(f"{name}: no test expects it to fire")
        if name not in silent:
            errors.append(f"{name}: no test expects it silent")
    unknown = (fires | silent) - set(names)
    if unknown:
        errors.append(f"tests name alerts the rules do not have: {sorted(unknown)}")
    if errors:
        fail("\n".join(errors))
    print(f"every one of the {len(names)} alerts is tested firing and silent")


def recorded(rules, dashboards):
    with open(rules) as f:
        groups = yaml.safe_load(f)["groups"]
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    used = set()
    for path in dashboards:
        used |= set(re.findall(r"namespace_pod:[A-Za-z0-9_]+:rate", pathlib.Path(path).read_text()))
    missing = sorted(used - records)
    if missing:
        fail(f"dashboards read series no recording rule writes: {missing}")
    print(f"the {len(used)} recorded series the dashboards read are recorded")


def main():
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "rules-file" and len(args) == 3:
        rules_file(*args)
    elif command == "annotations" and len(args) == 2:
        annotations(*args)
    elif command == "coverage" and len(args) >= 2:
        coverage(args[0], args[1:])
    elif command == "recorded" and len(args) >= 2:
        recorded(args[0], args[1:])
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
