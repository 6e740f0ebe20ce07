"""The HTML report (compiled.report.to_html): content checked in Python, behaviour in a real
headless Chromium (skipped only where no Chromium is installed; CI installs it)."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

import tilefuse
from tilefuse.demo import demo_model
from tilefuse.errors import TilefuseError
from tilefuse.report import html as report_html
from tilefuse.report.graph import plan_dot
from tilefuse.report.report import Report, ReportError


def _compile():
    model, inputs = demo_model()
    return tilefuse.compile(model, inputs, target="h100")    # gemm, chain and fused kernels; not run


@pytest.fixture(scope="module")
def compiled():
    return _compile()


@pytest.fixture(scope="module")
def page(compiled, tmp_path_factory) -> Path:
    return compiled.report.to_html(tmp_path_factory.mktemp("html") / "report.html")


def _data(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="tf-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


# --- the file ------------------------------------------------------------------------------------

def test_the_page_loads_nothing_from_the_network(page):
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in text
    # The markup (scripts emptied: the vendored engine holds Graphviz's own strings, such as
    # "<IMG", as data) refers to nothing that would be fetched: no external scripts, styles,
    # images, frames or imports.  The browser test watches the requests themselves.
    markup = re.sub(r"(<script[^>]*>).*?(</script>)", r"\1\2", text, flags=re.S)
    assert markup.count("<script") == 3
    assert not re.search(r"<script[^>]*\bsrc=", markup, re.I)
    assert not re.search(r"<(img|iframe|object|embed|audio|video|source|image)\b", markup, re.I)
    assert re.findall(r"<link\b[^>]*>", markup) == ['<link rel="icon" href="data:,">']
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", markup, re.I)
    assert not re.search(r"@import|url\(", markup, re.I)
    # The layout engine is inline, whole, with its notice.
    vendored = (Path(report_html.__file__).parent / "vendor" / report_html.VIZ_JS).read_text(encoding="utf-8")
    assert vendored in text
    assert "Viz.js 3.31.0 (MIT" in text and "Eclipse Public License" in text


def test_the_vendored_licences_ship_with_the_package():
    vendor = Path(report_html.__file__).parent / "vendor"
    assert "MIT License" in (vendor / "LICENSE").read_text()
    assert "Eclipse Public License" in (vendor / "LICENSE.graphviz-EPL-1.0.txt").read_text()
    assert "Permission is hereby granted" in (vendor / "LICENSE.expat.txt").read_text()


def test_same_model_gives_byte_identical_html(page, tmp_path):
    again = _compile().report.to_html(tmp_path / "again.html")
    assert again.read_bytes() == page.read_bytes()


def test_the_page_holds_every_kernel_with_its_source_and_costs(compiled, page):
    rep = compiled.report
    data = _data(page.read_text(encoding="utf-8"))
    assert [k["name"] for k in data["kernels"]] == [k.name for k in rep.kernels]
    families = {k.family for k in rep.kernels}
    assert {"gemm", "chain", "fused"} <= families
    for d, k, built, planned in zip(data["kernels"], rep.kernels, compiled.kernels, compiled.plan.kernels):
        assert d["source"] == built.source and d["language"] == built.language
        assert [p[0] for p in d["prims"]] == [p.name for p in planned.prims]
        assert (d["time_us"], d["bytes"], d["flops"], d["bound"], d["grid"]) == (k.est_us, k.bytes, k.flops, k.bound, k.grid)
        locations = {loc for _, _, loc in d["ops"]}
        assert {p.origin.location or "" for p in planned.prims} == locations
        assert d["schedule"]          # the family's choices: tiles, warps...
    # Every kernel is a cluster of the DOT graph, holding exactly its prims.
    for i, planned in enumerate(compiled.plan.kernels):
        block = re.search(rf"subgraph cluster_k{i} \{{(.*?)\n  \}}", data["dot"], re.S).group(1)
        assert sorted(re.findall(rf'id="k{i}-([^"]+)"', block)) == sorted(p.name for p in planned.prims)
    assert len(re.findall(r"subgraph cluster_k\d+ ", data["dot"])) == rep.num_kernels
    assert data["dot_full"] is None           # small enough: every prim drawn


def test_the_page_says_what_is_modelled(compiled, page):
    text = page.read_text(encoding="utf-8")
    assert "Times are <b>modelled</b>" in text and "No kernel was measured" in text
    for s, v in compiled.report.strategies.items():
        card = re.search(rf'<div class="strategy[^"]*" data-strategy="{s}">(.*?)</table></div>', text, re.S).group(1)
        assert f"{v['est_total_us']:,.3f} µs" in card and f">{v['num_kernels']}<" in card
    assert 'data-strategy="optimal"><h3>optimal (this plan)' in text.replace('class="strategy chosen" ', "")


def test_the_roofline_plots_each_kernel_under_the_targets_roofs(compiled, page):
    text = page.read_text(encoding="utf-8")
    svg = re.search(r'<svg id="roofline".*?</svg>', text, re.S).group(0)
    assert "DRAM 3.35 TB/s" in svg and "494.7 TFLOP/s" in svg and "67 TFLOP/s" in svg
    pts = {int(k): (float(x), float(y)) for k, x, y in
           re.findall(r'<circle class="pt" data-k="(\d+)" cx="([\d.]+)" cy="([\d.]+)"', svg)}
    kernels = compiled.report.kernels
    assert sorted(pts) == [i for i, k in enumerate(kernels) if k.flops and k.bytes]
    # Log-log: more flops per byte is further right, more flops per second higher (smaller y).
    order = sorted(pts, key=lambda i: kernels[i].flops / kernels[i].bytes)
    assert [pts[i][0] for i in order] == sorted(pts[i][0] for i in order)
    order = sorted(pts, key=lambda i: kernels[i].flops / kernels[i].est_us)
    assert [pts[i][1] for i in order] == sorted((pts[i][1] for i in order), reverse=True)


def test_large_plans_collapse_kernels_past_the_budget(compiled):
    snap = compiled.report._snapshot
    labels = [k.name for k in compiled.report.kernels]
    families = [k.family for k in compiled.report.kernels]
    sizes = [len(k.prims) for k in snap.kernels]
    drawn = 3                              # (the first two kernels need not read each other)
    dot = plan_dot(snap, labels, families, budget=sum(sizes[:drawn]))
    assert len(re.findall(r"subgraph cluster_k\d+ ", dot)) == len(sizes)       # still one cluster per kernel
    assert sorted(re.findall(r'id="(k\d+)-all"', dot)) == [f"k{i}" for i in range(drawn, len(sizes))]
    declared = set(re.findall(r'^\s*"([^"]+)" \[', dot, re.M))
    edges = re.findall(r'^\s*"([^"]+)" -> "([^"]+)";', dot, re.M)
    assert edges and all(a in declared and b in declared for a, b in edges)
    def kernel(node: str) -> int | None:                     # "k3/t12" -> 3; graph inputs: None
        m = re.match(r"k(\d+)/", node)
        return int(m.group(1)) if m else None
    across = [(a, b) for a, b in edges if None not in (kernel(a), kernel(b)) and kernel(a) != kernel(b)]
    # an edge between the two drawn kernels names prims; one into a collapsed kernel names it whole
    assert any(kernel(b) < drawn and not b.endswith("/*") for a, b in across)
    assert any(b.endswith("/*") for a, b in across)
    assert all(b.endswith("/*") == (kernel(b) >= drawn) for a, b in across)


def test_report_dict_is_unchanged_by_the_snapshot(compiled):
    d = compiled.report.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(Report)}
    assert {"target", "backend", "strategy", "num_ops", "num_prims", "prims_by_category", "num_kernels",
            "kernels", "est_total_us", "strategies", "solver", "compile_seconds"} <= set(d)
    json.dumps(d)


def test_a_report_without_a_plan_or_a_bad_path_is_a_clear_error(compiled, tmp_path):
    bare = Report(target="h100", backend="triton", strategy="optimal", num_ops=0, num_prims=0, prims_by_category={})
    with pytest.raises(ReportError, match="no plan to draw"):
        bare.to_html(tmp_path / "x.html")
    with pytest.raises(TilefuseError, match="cannot write the HTML report"):
        compiled.report.to_html(tmp_path / "missing" / "x.html")


def test_script_data_cannot_close_its_element():
    s = report_html._json_for_script({"source": "</script><script>alert(1)</script><!--"})
    assert "<" not in s and ">" not in s
    assert json.loads(s) == {"source": "</script><script>alert(1)</script><!--"}


# --- in a browser --------------------------------------------------------------------------------

def _find(*names: str) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="module")
def browser():
    chromium = _find("chromium", "chromium-browser")
    driver_path = _find("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("no chromium/chromedriver installed (apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium            # explicit paths: Selenium Manager never downloads
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--host-resolver-rules=MAP * ~NOTFOUND"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    yield driver
    driver.quit()


def _open(driver, path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get_log("browser"), driver.get_log("performance")        # drop earlier pages' entries
    driver.get(path.as_uri())
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.graph") in ("ready", "error"))
    assert driver.execute_script("return document.body.dataset.graph") == "ready"


def _panel_kernel(driver) -> str:
    return driver.execute_script("return document.querySelector('#panel h2').textContent")


def test_page_renders_one_cluster_per_kernel_without_errors_or_requests(browser, compiled, page):
    _open(browser, page)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    urls = [json.loads(e["message"])["message"]["params"]["request"]["url"] for e in browser.get_log("performance")
            if '"Network.requestWillBeSent"' in e["message"]]
    assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls
    ids = browser.execute_script("return Array.from(document.querySelectorAll('#graph svg g.cluster')).map(g => g.id)")
    assert ids == [f"k{i}" for i in range(compiled.report.num_kernels)]
    prims = browser.execute_script("return document.querySelectorAll('#graph svg g.node[id^=\"k\"]').length")
    assert prims == sum(len(k.prims) for k in compiled.plan.kernels)


def test_clicking_a_kernel_shows_its_source(browser, compiled, page):
    from selenium.webdriver.common.by import By
    _open(browser, page)
    i = next(i for i, k in enumerate(compiled.report.kernels) if k.family == "chain")
    browser.find_element(By.CSS_SELECTOR, f"#graph g#k{i} > text").click()        # the cluster's label
    assert _panel_kernel(browser) == f"#{i} {compiled.report.kernels[i].name}"
    shown = browser.execute_script("return document.querySelector('#panel pre.source').textContent")
    assert shown == compiled.kernels[i].source and "@triton.jit" in shown
    assert browser.execute_script(f"return document.getElementById('k{i}').classList.contains('sel')")
    # A prim node selects the kernel it belongs to.
    first = compiled.plan.kernels[0].prims[0].name
    browser.find_element(By.CSS_SELECTOR, f"#graph g#k0-{first}").click()
    assert _panel_kernel(browser) == f"#0 {compiled.report.kernels[0].name}"
    panel = browser.find_element(By.ID, "panel").text
    assert "modelled" in panel and "not measured" in panel and compiled.kernels[0].name in panel


def test_the_kernel_table_sorts_by_time(browser, compiled, page):
    from selenium.webdriver.common.by import By
    _open(browser, page)
    kernels = compiled.report.kernels
    order = lambda: [int(k) for k in browser.execute_script(  # noqa: E731
        "return Array.from(document.querySelectorAll('#kernels tbody tr')).map(r => r.dataset.k)")]
    assert order() == list(range(len(kernels)))
    header = browser.find_element(By.XPATH, "//table[@id='kernels']//th[normalize-space()='time µs']")
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    assert order() == sorted(range(len(kernels)), key=lambda i: (kernels[i].est_us, i))
    assert order() != list(range(len(kernels)))          # the demo plan's times are not in plan order
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    assert [kernels[i].est_us for i in order()] == sorted((k.est_us for k in kernels), reverse=True)
    # A row (and a roofline point) selects its kernel.
    browser.find_element(By.CSS_SELECTOR, "#kernels tbody tr[data-k='4'] td:nth-child(2)").click()
    assert _panel_kernel(browser) == f"#4 {kernels[4].name}"
    browser.find_element(By.CSS_SELECTOR, "#roofline .pt[data-k='1']").click()
    assert _panel_kernel(browser) == f"#1 {kernels[1].name}"


def test_a_collapsed_graph_draws_every_prim_on_request(browser, compiled, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    monkeypatch.setattr(report_html, "MAX_PRIM_NODES", len(compiled.plan.kernels[0].prims))
    path = compiled.report.to_html(tmp_path / "collapsed.html")
    _open(browser, path)
    n = compiled.report.num_kernels
    count = "return document.querySelectorAll('#graph svg g.cluster').length"
    assert browser.execute_script(count) == n
    assert browser.execute_script("return document.querySelectorAll('#graph svg g.node[id$=\"-all\"]').length") == n - 1
    browser.find_element(By.ID, "show-all").click()
    WebDriverWait(browser, 60).until(lambda d: d.execute_script(
        "return document.body.dataset.graph === 'ready' && !document.querySelector('#graph svg g.node[id$=\"-all\"]')"))
    assert browser.execute_script(count) == n
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
