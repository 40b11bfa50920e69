"""The leaderboard in a real headless chromium (Debian's), driven by playwright."""
import os
import shutil
from pathlib import Path

import pytest

from claimbench import ingest
from claimbench.appserver import CHROMIUM, CHROMIUM_ARGS, serve

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]


@pytest.fixture(scope="module")
def server(fixture_db, tmp_path_factory):
    db = tmp_path_factory.mktemp("served") / "served.duckdb"
    shutil.copy(fixture_db, db)
    with serve(db) as url:
        yield url, db


@pytest.fixture(scope="module")
def page():
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def visit(page, url, name, heading):
    page.goto(url)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_claims_page_shows_a_known_claim_verdict_and_plot(server, page):
    url, _ = server
    visit(page, url + "/", "claims", "Claims vs measured")
    assert "Claims vs measured" in page.inner_text("body")
    assert "Deploy" not in page.inner_text("body")  # the viewer toolbar: no Streamlit Cloud button
    page.wait_for_selector(".vega-embed", timeout=30_000)
    frame = page.locator("[data-testid='stDataFrame']").first
    frame.wait_for(timeout=30_000)
    # glide-data-grid draws on canvas; its accessible table carries the cell text
    cells = page.locator("[data-testid='stDataFrame'] table").first.inner_text(timeout=30_000)
    assert "speedup-at-equal-recall" in cells and "gate failed" in cells


def test_filter_narrows_the_table(server, page):
    url, _ = server
    visit(page, url + "/", "claims-before-filter", "Claims vs measured")
    page.get_by_role("combobox", name="Machine").click()
    page.get_by_role("option", name="gpu-box").click()
    page.keyboard.press("Escape")
    page.wait_for_timeout(1500)
    cells = page.locator("[data-testid='stDataFrame'] table").first.inner_text(timeout=30_000)
    assert "gpu-box" in cells and "cpu-box" not in cells
    page.screenshot(path=str(ARTIFACTS / "claims-filtered.png"), full_page=True)


@pytest.mark.parametrize("path, expect", [("leaderboard", "Leaderboard"), ("paper?paper=lychee", "Lychee"),
                                          ("alerts", "Alerts"), ("machines", "Machines")])
def test_every_page_loads(server, page, path, expect):
    url, _ = server
    said = []

    def listen(message):
        said.append(message.text)
    page.on("console", listen)
    try:
        visit(page, f"{url}/{path}", path.split("?")[0], expect)
        if path.startswith(("leaderboard", "paper")):
            page.wait_for_selector(".vega-embed", timeout=30_000)
            page.wait_for_timeout(1000)
    finally:
        page.remove_listener("console", listen)
    # vega's warnings of what it could not draw: a log axis whose domain holds zero (no bar at all), a
    # layer with no values (an interval layer where no interval was recorded)
    assert not [text for text in said if text.startswith("WARN") and ("zero" in text or "Infinite extent" in text)], said


@pytest.mark.parametrize("path, heading, reading", [("", "Claims vs measured", "Per parameter combination"),
                                                     ("paper?paper=lychee", "Lychee", "Per parameter combination"),
                                                     ("alerts", "Alerts", "open its series")])
def test_a_selected_row_is_written_out_in_full(server, page, path, heading, reading):
    url, _ = server
    name = path.split("?")[0] or "claims"
    visit(page, f"{url}/{path}", f"{name}-unselected", heading)
    grid = page.locator("[data-testid='stDataFrame']").first
    grid.wait_for(timeout=30_000)
    box = grid.bounding_box()
    page.mouse.click(box["x"] + 12, box["y"] + 52)  # the selection box of the first row, under the 35 px header
    page.get_by_text(reading).first.wait_for(timeout=30_000)  # a claim: its words, then its combinations
    page.screenshot(path=str(ARTIFACTS / f"{name}-selected.png"), full_page=True)


def test_a_filter_that_changes_the_rows_clears_the_selection(server, page):
    url, _ = server
    visit(page, url + "/", "claims-before-selection", "Claims vs measured")
    grid = page.locator("[data-testid='stDataFrame']").first
    grid.wait_for(timeout=30_000)
    box = grid.bounding_box()
    page.mouse.click(box["x"] + 12, box["y"] + 35 * 4 + 17)  # the fifth row's selection box
    page.get_by_text("Claimed:").first.wait_for(timeout=30_000)
    page.get_by_role("combobox", name="Machine").click()
    page.get_by_role("option", name="gpu-box").click()
    page.keyboard.press("Escape")
    page.wait_for_timeout(2000)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.get_by_text("Claimed:").count() == 0  # not another claim that now sits at the fifth row
    page.screenshot(path=str(ARTIFACTS / "claims-selection-filtered.png"), full_page=True)


def test_ingest_while_serving(server, page, tmp_path):
    url, db = server
    from tests.app.conftest import lychee_run
    results = tmp_path / "results"
    results.mkdir()
    lychee_run(results, "late-box", 0, [1.0, 1.0, 20.0, 20.0], 1.0)
    visit(page, url + "/machines", "machines-before", "Machines")
    report = ingest.ingest([results], db=db, wait_s=30)
    assert report.ok and report.added == 1
    visit(page, url + "/machines", "machines-after", "Machines")
    cells = page.locator("[data-testid='stDataFrame'] table").first.inner_text(timeout=30_000)
    assert "late-box" in cells
