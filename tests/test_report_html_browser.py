"""report.html and compare.html in a real browser: headless Debian chromium driven by playwright.

The default config (config/config.yaml) runs for real (``report_html`` targets of its three workloads, CPU
here); each page is opened from disk (file://) and must render its operator table (one row per row of
operators.parquet), sort it on a header click, draw every plotly figure, log no console error and request
nothing from the network (self-contained). A screenshot of each page is kept in the test's tmp folder.

The browser is the system's ``/usr/bin/chromium`` (installed here with apt-get when missing), never a
playwright download. Without it, or without playwright: skipped, or failed when ``CI`` is set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from results_folders import CUDA_OPS, add_work, write_results

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
WORKLOADS = ("gpt2", "sdpa_attention", "lstm")
ODD_NAME = "void at::native::kernel<float, 4>&<script>"


def _unavailable(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI run: the browser test must run)")
    pytest.skip(why)


def _install_chromium() -> None:
    if CHROMIUM.exists():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        _unavailable("no /usr/bin/chromium and no apt-get as root to install it")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    for cmd in ([*apt, "update"], [*apt, "install", "-y", "--no-install-recommends", "chromium"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0:
            _unavailable(f"could not install chromium ({' '.join(cmd)}): {done.stderr.strip()[-500:]}")
    if not CHROMIUM.exists():
        _unavailable("apt-get installed chromium, but /usr/bin/chromium is missing")


@pytest.fixture(scope="module")
def browser():
    _install_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The default config's report.html of every workload (and what they need), run for real."""
    work = tmp_path_factory.mktemp("default run")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(work), "--configfile",
           str(ROOT / "config" / "config.yaml"), "--cores", "2", *(f"results/{w}/report.html" for w in WORKLOADS)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return work


def open_page(browser, path: Path, screenshot: Path):
    """The page loaded from disk, with every console error and non-file request recorded."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    page.on("request", lambda r: None if r.url.startswith(("file://", "data:", "blob:", "about:"))
            else problems.append(f"network request: {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("Array.from(document.querySelectorAll('.plotly-graph-div'))"
                           ".every(d => d.querySelector('.main-svg'))")
    page.screenshot(path=str(screenshot), full_page=True)
    return page, problems


def assert_real_screenshot(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert image.width >= 1000 and image.height >= 1000
    assert colors is None or len(colors) > 50, "the screenshot is (nearly) one colour"


def assert_figures_drawn(page) -> int:
    """Every plotly figure has its SVG and drawn marks (bars or points with a real path)."""
    drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(div => {
        const marks = div.querySelectorAll('.main-svg .cartesianlayer .point path, .main-svg .cartesianlayer path.point');
        const real = Array.from(marks).filter(p => { const d = p.getAttribute('d') || '';
                                                     return d.length > 4 && d !== 'M0,0Z'; });
        return {id: div.id, svg: !!div.querySelector('.main-svg'), marks: real.length};
    })""")
    assert drawn, "no plotly figure on the page"
    for figure in drawn:
        assert figure["svg"] and figure["marks"] > 0, figure
    return len(drawn)


def column_values(page, table: str, col: int) -> list[str]:
    return page.evaluate(f"""() => Array.from(document.querySelectorAll('#{table} tbody tr'))
                             .map(r => r.cells[{col}].dataset.v ?? r.cells[{col}].textContent)""")


def header_index(page, table: str, prefix: str) -> int:
    headers = page.evaluate(f"() => Array.from(document.querySelectorAll('#{table} thead th')).map(h => h.textContent)")
    return next(i for i, h in enumerate(headers) if h.startswith(prefix))


def click_sort(page, table: str, col: int, expect: str) -> None:
    page.locator(f"#{table} thead th").nth(col).click()
    assert page.locator(f"#{table} thead th").nth(col).get_attribute("aria-sort") == expect


def roofline_marks(page) -> int:
    """The drawn point marks of the roofline figure (its ceiling lines have none)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#fig-roofline .scatterlayer path.point'))
                             .filter(p => { const d = p.getAttribute('d') || ''; return d.length > 4 && d !== 'M0,0Z'; })
                             .length""")


def known_work_count(operators: pd.DataFrame) -> int:
    """Operators with known work that moves bytes, in measured time: one roofline point each (a point at its
    intensity, or a triangle at the left edge for 0 FLOPs)."""
    return int((operators["work_known"] & (operators["bytes"] > 0) & (operators["time_ns"] > 0)).sum())


@pytest.mark.workflow
@pytest.mark.parametrize("workload", WORKLOADS)
def test_report_page_renders_sorts_and_is_self_contained(browser, default_run, workload, tmp_path):
    folder = default_run / "results" / workload
    operators = pd.read_parquet(folder / "operators.parquet")
    shot = tmp_path / f"{workload}.png"
    page, problems = open_page(browser, folder / "report.html", shot)
    try:
        assert page.locator("#operator-table tbody tr").count() == len(operators)
        time_col = header_index(page, "operator-table", "time (ms)")
        # as written: by time, descending
        assert [int(v) for v in column_values(page, "operator-table", time_col)] == list(operators["time_ns"])
        click_sort(page, "operator-table", time_col, "ascending")
        assert [int(v) for v in column_values(page, "operator-table", time_col)] == sorted(operators["time_ns"])
        click_sort(page, "operator-table", time_col, "descending")
        assert [int(v) for v in column_values(page, "operator-table", time_col)] == sorted(operators["time_ns"],
                                                                                             reverse=True)
        calls_col = header_index(page, "operator-table", "calls")
        click_sort(page, "operator-table", calls_col, "ascending")
        assert [int(v) for v in column_values(page, "operator-table", calls_col)] == sorted(operators["calls"])
        op_col = header_index(page, "operator-table", "operator")
        click_sort(page, "operator-table", op_col, "ascending")
        names = column_values(page, "operator-table", op_col)
        assert sorted(names) == sorted(operators["operator"])
        assert page.evaluate("n => n.every((x, i) => !i || n[i - 1].toLowerCase().localeCompare(x.toLowerCase()) <= 0)",
                             names)
        figures = assert_figures_drawn(page)
        layered = (pd.read_parquet(folder / "layer_classes.parquet")["layer_class"] != "rest").any()
        # time share, roofline, [layer classes], modules; no ncu counters on CPU: the roofline replaces the SOL note
        assert figures == (4 if layered else 3)
        assert roofline_marks(page) == known_work_count(operators) > 0
        assert page.locator("#sol-note").count() == 0 and page.locator("#roofline").is_visible()
        assert problems == []
    finally:
        page.close()
    assert_real_screenshot(shot)


@pytest.mark.workflow
def test_compare_page_renders_in_the_browser(browser, default_run, tmp_path):
    """The default run's gpt2 against a copy with one operator twice as slow, one gone and one new."""
    a = default_run / "results" / "gpt2"
    b = tmp_path / "after" / "gpt2"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("*.html", "trace.json"))
    ops = pd.read_parquet(a / "operators.parquet")
    # compare reads the per-iteration medians (aggregate.per_iteration, on in the default config)
    assert "iteration_median_ns" in ops
    changed = ops.copy()
    changed.loc[0, ["time_ns", "iteration_median_ns"]] *= 2
    changed = pd.concat([changed.iloc[:-1], changed.iloc[[0]].assign(operator=ODD_NAME, time_ns=12345,
                                                                     iteration_median_ns=12345)],
                        ignore_index=True)
    changed.to_parquet(b / "operators.parquet", index=False)
    out = tmp_path / "compare.html"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "compare", str(a), str(b), "-o", str(out)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            timeout=120)
    assert result.returncode == 0, result.stderr
    shot = tmp_path / "compare.png"
    page, problems = open_page(browser, out, shot)
    try:
        assert page.locator("#compare-table tbody tr").count() == len(ops) + 1
        names = column_values(page, "compare-table", 0)
        assert ODD_NAME in names  # escaped in the HTML, shown as written
        delta_col = header_index(page, "compare-table", "delta (ms)")
        deltas = dict(zip(names, map(float, column_values(page, "compare-table", delta_col))))
        assert deltas[ops.loc[0, "operator"]] == pytest.approx(ops.loc[0, "iteration_median_ns"] / 1e6)
        assert deltas[ops.iloc[-1]["operator"]] == pytest.approx(-ops.iloc[-1]["iteration_median_ns"] / 1e6)
        assert deltas[ODD_NAME] == pytest.approx(12345 / 1e6)
        click_sort(page, "compare-table", delta_col, "ascending")
        assert [float(v) for v in column_values(page, "compare-table", delta_col)] == sorted(deltas.values())
        assert assert_figures_drawn(page) == 1
        assert problems == []
    finally:
        page.close()
    assert_real_screenshot(shot)


def test_cuda_operator_table_keeps_the_operator_column_readable(browser, tmp_path):
    """Counter columns name their ncu metric (long, no spaces) in the header: the metric name wraps, and the
    operator column keeps its width (it used to shrink to ~70 px, a template name ~20 lines tall). Two long
    names sharing their first 60 characters are two bars."""
    prefix = "void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, at::native::FillFunctor<"
    ops = [*CUDA_OPS, (prefix + "float>, std::array<char*, 1> >(int)", 700_000, 20.0, 60.0),
           (prefix + "double>, std::array<char*, 1> >(int)", 600_000, 21.0, 61.0)]
    # per-iteration columns too (aggregate.per_iteration, the default): the widest table a run writes
    per_iteration = {o[0]: [o[1], o[1] * 11 // 10, o[1] * 9 // 10] for o in ops}
    operators = write_results(tmp_path / "gpt2", ops, device="cuda", per_iteration=per_iteration)
    out = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "report-html", "--results",
                             str(tmp_path / "gpt2"), "-o", str(out)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert result.returncode == 0, result.stderr
    shot = tmp_path / "cuda.png"
    page, problems = open_page(browser, out, shot)
    try:
        widths = page.evaluate("() => Array.from(document.querySelectorAll('#operator-table td.name'))"
                               ".map(td => td.getBoundingClientRect().width)")
        assert len(widths) == len(operators) and min(widths) >= 250, widths
        metric = page.evaluate("() => { const m = document.querySelector('#operator-table th .metric');"
                               " return {w: m.getBoundingClientRect().width, lines: m.getClientRects().length,"
                               " h: m.getBoundingClientRect().height}; }")
        assert metric["h"] > 20 and metric["w"] < 200, metric  # wrapped onto several lines, not one wide line
        bars = page.evaluate("() => document.querySelectorAll('#fig-operator-share .point path').length")
        assert bars == len(operators)
        assert assert_figures_drawn(page) == 4 and problems == []  # share, SOL, layer classes, modules
        # Scrolled fully right, the operator column stays at the container's left edge, above the other cells
        # (sticky), and the header corner above the other headers.
        box = page.locator("#operators .scroll")
        box.scroll_into_view_if_needed()
        sizes = box.evaluate("b => ({scroll: b.scrollWidth, client: b.clientWidth})")
        assert sizes["scroll"] > sizes["client"] + 200, sizes  # the table does scroll sideways
        box.evaluate("b => { b.scrollLeft = b.scrollWidth; }")
        page.wait_for_function("() => { const b = document.querySelector('#operators .scroll');"
                               " return b.scrollLeft + b.clientWidth >= b.scrollWidth - 1; }")
        edges = page.evaluate("""() => {
            const b = document.querySelector('#operators .scroll'), r = b.getBoundingClientRect();
            const td = document.querySelector('#operator-table tbody tr td.name').getBoundingClientRect();
            const th = document.querySelector('#operator-table thead th').getBoundingClientRect();
            const x = td.left + 20, y = td.top + td.height / 2;
            const hit = document.elementFromPoint(x, y);
            const corner = document.elementFromPoint(th.left + 20, th.top + th.height / 2);
            return {box: r.left + b.clientLeft, td: td.left, th: th.left, right: td.right, boxRight: r.right,
                    hitName: !!(hit && hit.closest('td.name')), cornerIsHead: !!(corner && corner.closest('thead th')
                    && corner.closest('th') === document.querySelector('#operator-table thead th'))};
        }""")
        assert abs(edges["td"] - edges["box"]) <= 2 and abs(edges["th"] - edges["box"]) <= 2, edges
        assert edges["right"] < edges["boxRight"] and edges["hitName"] and edges["cornerIsHead"], edges
        page.screenshot(path=str(tmp_path / "cuda-scrolled.png"))
        box.screenshot(path=str(tmp_path / "cuda-table-scrolled.png"))
    finally:
        page.close()
    assert_real_screenshot(shot)


def test_roofline_renders_its_points_and_hover(browser, tmp_path):
    """A CPU page with the work columns: the roofline replaces the empty speed-of-light note, draws one mark per
    operator with known work (the data-movement one a triangle at the left edge) and its ceiling lines, and the
    triangle's hover says its share of the bandwidth."""
    ops = [("aten::addmm", 4_000_000), ("aten::gelu", 1_000_000), ("aten::copy_", 500_000), ("aten::view", 100_000),
           ("aten::custom_scan", 50_000)]
    write_results(tmp_path / "gpt2", ops)
    operators = add_work(tmp_path / "gpt2", {"aten::addmm": (1.6e8, 8e6, "float32"),
                                             "aten::gelu": (2e6, 1.6e7, "float32"),
                                             "aten::copy_": (0.0, 6e6, "float32"), "aten::view": (0.0, 0.0, "float32"),
                                             "aten::custom_scan": (None, None, "float32", "no FLOP rule")})
    out = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "report-html", "--results",
                             str(tmp_path / "gpt2"), "-o", str(out)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert result.returncode == 0, result.stderr
    shot = tmp_path / "roofline.png"
    page, problems = open_page(browser, out, shot)
    try:
        assert known_work_count(operators) == 3
        assert roofline_marks(page) == 3
        assert page.locator("#sol-note").count() == 0 and page.locator("#work-unknown-table tbody tr").count() == 1
        lines = page.evaluate("() => document.querySelectorAll('#fig-roofline .scatterlayer .trace path.js-line')"
                              ".length")
        from results_folders import CEILINGS

        assert lines == 1 + len(CEILINGS["compute_flops_per_s"])  # the memory roof and every measured GEMM peak
        triangle = page.locator("#fig-roofline .scatterlayer .trace:last-child path.point")  # data movement
        page.locator("#fig-roofline").scroll_into_view_if_needed()
        box = triangle.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_selector("#fig-roofline .hoverlayer .hovertext")
        hover = page.locator("#fig-roofline .hoverlayer .hovertext").text_content()
        bytes_s = 6e6 / (500_000 / 1e9)
        assert f"data movement only: {bytes_s / 1e9:.3g} GB/s = {bytes_s / 1.2e10 * 100:.0f} % of bandwidth" in hover
        assert problems == []
        page.locator("#roofline").screenshot(path=str(tmp_path / "roofline-section.png"))
    finally:
        page.close()
    assert_real_screenshot(shot)
