"""What the reports show of advice.json (optimize/advisor.py): the advised changes with their evidence, the
changes not offered and why, the diagnoses."""

from __future__ import annotations


def markdown_lines(advice: dict | None) -> list[str]:
    """The report.md section "Advice" (nothing when the profile has no advice.json)."""
    if not advice:
        return []
    lines = ["## Advice", ""]
    advised = advice.get("advised_changes") or []
    lines.append(f"Advised variant: **{' + '.join(advised) if advised else 'no change'}** (rule catalog "
                 f"`{advice.get('catalog')}`; each change is verified before it is recommended: "
                 "results/<workload>/optimize/ when the workload is under optimize.workloads).")
    lines.append("")
    for record in advice.get("advice", []):
        lines.append(f"- **{record['change']}** (rule `{record['rule']}`): {record['evidence']}. "
                     f"Expected: {record['expect']}.")
    sources = advice.get("sources") or {}
    for change in advised:
        if not any(r["change"] == change for r in advice.get("advice", [])):
            lines.append(f"- **{change}**: {sources.get(change, '')}.")
    for record in advice.get("not_offered", []):
        lines.append(f"- not offered: {record['change']} (rule `{record['rule']}`): {record['reason']}. "
                     f"Evidence: {record['evidence']}.")
    for text in advice.get("diagnoses", []):
        lines += ["", f"Diagnosis: {text}"]
    return lines + [""]
