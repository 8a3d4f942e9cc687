"""What the reports show of advice.json (optimize/advisor.py): the advised changes with their evidence and its
spread over the measured iterations, the borderline rules (not advised), the changes not offered and why, the
diagnoses, and a warning when the capture ran on a busy machine."""

from __future__ import annotations


def interval_text(advice: dict, record: dict) -> str:
    """A rule record's per-iteration interval in words (``[low, high] over N iterations``, shares as percents),
    or why the rule was decided on the single figure; "" for a record without either."""
    interval = record.get("interval")
    if not interval:
        return record.get("interval_note") or ""
    unit = ((advice.get("measures") or {}).get(record.get("measure")) or {}).get("unit")
    fmt = (lambda v: f"{v:.1%}") if unit == "share" else (lambda v: f"{v:.3g}")
    return (f"across the measured iterations {fmt(interval['low'])} to {fmt(interval['high'])} "
            f"(interquartile range over {interval['iterations']})")


def markdown_lines(advice: dict | None) -> list[str]:
    """The report.md section "Advice" (nothing when the profile has no advice.json)."""
    if not advice:
        return []
    lines = ["## Advice", ""]
    for warning in advice.get("warnings") or []:
        lines += [f"**Warning**: {warning}.", ""]
    advised = advice.get("advised_changes") or []
    lines.append(f"Advised variant: **{' + '.join(advised) if advised else 'no change'}** (rule catalog "
                 f"`{advice.get('catalog')}`; each change is verified before it is recommended: "
                 "results/<workload>/optimize/ when the workload is under optimize.workloads).")
    lines.append("")
    for record in advice.get("advice", []):
        spread = interval_text(advice, record)
        lines.append(f"- **{record['change']}** (rule `{record['rule']}`): {record['evidence']}"
                     + (f"; {spread}" if spread else "") + f". Expected: {record['expect']}.")
    sources = advice.get("sources") or {}
    for change in advised:
        if not any(r["change"] == change for r in advice.get("advice", [])):
            lines.append(f"- **{change}**: {sources.get(change, '')}.")
    for record in advice.get("borderline", []):
        lines.append(f"- borderline, not advised: {record['change']} (rule `{record['rule']}`): {record['reason']}.")
    for record in advice.get("not_offered", []):
        lines.append(f"- not offered: {record['change']} (rule `{record['rule']}`): {record['reason']}. "
                     f"Evidence: {record['evidence']}.")
    for text in advice.get("diagnoses", []):
        lines += ["", f"Diagnosis: {text}"]
    return lines + [""]
