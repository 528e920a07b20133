"""The course in a real browser: JupyterLab 4 served headless, driven by Chromium.

nbval proves the notebooks' outputs; this proves what a learner sees. A JupyterLab server
(127.0.0.1, a free port, a token) serves a copy of the notebooks; Chromium runs every cell of
lesson 00 (launches streaming per-rank lines, a staged failure that must not stop "Run All"),
of lesson 02 (an ipywidgets explorer whose output must follow its slider), and of lesson 00 in
Chinese as a Chinese learner meets it (JupyterLab's interface and the launcher's messages in Chinese). Screenshots of a
launch cell and of the widget are kept in `tests/artifacts/` (the README shows them).

Chromium comes from the system (Debian's `chromium` package) and Playwright from PyPI: no
browser is downloaded. Without them the test is skipped with a message saying how to enable
it, except in CI (CI=true), where a skip would hide a missing install step and so fails.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = pytest.mark.slow  # every test here starts ranks, a kernel or a browser: left out by `-m "not slow"`

from fourcard_helpers.lifecycle import first_dead, free_ports, stop, wait_until  # noqa: E402
from fourcard_helpers.rundir import LANG_ENV  # noqa: E402
from helpers import ROOT  # noqa: E402
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
RUN_ALL_LIMIT_S = 600  # generous: a lesson takes well under 90 s; this only stops a hung page


def _requirements() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed: pip install playwright"
    if CHROMIUM is None:
        return "no Chromium found: install it (Debian/Ubuntu: sudo apt-get install chromium)"
    return None


missing = _requirements()
if missing:
    if os.environ.get("CI"):
        pytest.fail(f"the browser test must run in CI: {missing}", pytrace=False)
    pytest.skip(f"browser test skipped: {missing}", allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JupyterLab server on a copy of the notebooks; yields its base URL with the token."""
    yield from serve(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def chinese_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, with JupyterLab's interface in Chinese (the README's `.[zh]` extra) and the
    launcher's messages in Chinese (FOURCARDS_LANG=zh, as the instructor guide sets it)."""
    yield from serve(tmp_path_factory.mktemp("lab_zh"), locale="zh_CN")


def serve(workdir: Path, locale: str = "en") -> Iterator[str]:
    # a copy (the browser may autosave: not ours), with notebooks/zh/'s links kept as links
    shutil.copytree(ROOT / "notebooks", workdir / "notebooks", symlinks=True)
    settings = workdir / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no "Jupyter news?" toast over the screenshots, and no request to the internet for it
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    language = workdir / "settings" / "@jupyterlab" / "translation-extension"
    language.mkdir(parents=True)
    (language / "plugin.jupyterlab-settings").write_text(json.dumps({"locale": locale}))
    port, token = free_ports(1)[0], secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir / 'notebooks'}",
               "--expose-app-in-browser", "--ServerApp.open_browser=False",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root; jupyter refuses root without it
    log = open(workdir / "lab.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(workdir / "settings"),
           LANG_ENV: "zh" if locale.startswith("zh") else "en"}
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    def answers() -> bool:  # the server is up when /api answers
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=1)
            return True
        except OSError:
            return False

    try:
        try:  # the bound ends a failure only
            died = wait_until(answers, 120, lambda: first_dead({"jupyter lab": server}))
            why = f"{died} exited" if died else None
        except TimeoutError:
            why = "jupyter lab did not answer within 120 s"
        if why:
            raise RuntimeError(f"{why}: {(workdir / 'lab.log').read_text()[-2000:]}")
        yield f"{url}|{token}"
    finally:
        stop([server], grace=20)  # the server and every kernel it started: its group, SIGTERM, then SIGKILL
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def open_notebook(browser: Any, lab: str, name: str) -> Page:
    url, token = lab.split("|")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # ?reset: a fresh workspace, not one restored with other tabs open
    page.goto(f"{url}/lab/tree/{name}?reset&token={token}")
    page.wait_for_function(
        """name => window.jupyterapp && window.jupyterapp.shell.currentWidget
           && window.jupyterapp.shell.currentWidget.context
           && window.jupyterapp.shell.currentWidget.context.path.endsWith(name)
           && window.jupyterapp.shell.currentWidget.sessionContext.session
           && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel
           && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected'""",
        arg=name, timeout=120_000)
    return page


def run_all(page: Page) -> list[dict[str, Any]]:
    """Run every cell as a learner's "Run All" does; return each code cell's source, tags and outputs.

    JupyterLab 4 renders cells lazily, so outputs are read from the notebook model, not the page.
    """
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        """() => {
             const nb = window.jupyterapp.shell.currentWidget;
             const cells = Array.from(nb.content.model.cells).filter(c => c.type === 'code');
             const kernel = nb.sessionContext.session.kernel;
             return cells.every(c => c.executionCount !== null) && kernel.status === 'idle';
           }""", timeout=RUN_ALL_LIMIT_S * 1000, polling=500)
    return page.evaluate(
        """() => Array.from(window.jupyterapp.shell.currentWidget.content.model.cells)
               .filter(c => c.type === 'code')
               .map(c => ({source: c.sharedModel.getSource(), tags: c.getMetadata('tags') || [],
                           outputs: c.outputs.toJSON()}))""")


def text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for out in outputs:
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
        if out.get("output_type") == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)


def errors(cell: dict[str, Any]) -> list[dict[str, Any]]:
    return [out for out in cell["outputs"] if out.get("output_type") == "error"]


def test_lesson_00_runs_in_the_browser_with_live_ranks_and_a_readable_failure(browser: Any, lab: str) -> None:
    page = open_notebook(browser, lab, "00_cards_and_launching.ipynb")
    cells = run_all(page)
    launches = [cell for cell in cells if cell["source"].startswith("%%torchrun")]
    assert launches, "lesson 00 has no launch cell"
    for cell in launches:
        shown = text_of(cell["outputs"])
        assert (all(f"[rank{rank}]" in shown for rank in range(4)) or errors(cell)
                or "○ not launched" in shown), cell["source"][:80]  # the last: an exercise's skeleton
    failing = [cell for cell in cells if "raises-exception" in cell["tags"]]
    assert failing and all(errors(cell) for cell in failing), "the staged failure shows no error"
    assert all("LaunchError" in errors(cell)[0]["ename"] for cell in failing if cell["source"].startswith("%%torchrun"))
    assert cells[-1]["outputs"] or cells.index(failing[-1]) < len(cells) - 1  # Run All went on past it
    after = cells[cells.index(failing[-1]) + 1:]
    assert after and all(cell["outputs"] or not cell["source"].strip() for cell in after[:1])
    unexpected = [cell["source"][:80] for cell in cells if errors(cell) and "raises-exception" not in cell["tags"]]
    assert not unexpected, f"cells errored in the browser: {unexpected}"
    # what the page shows, not only the model: the first launch's rank lines are rendered
    first = page.locator(".jp-CodeCell", has_text="%%torchrun").first
    first.scroll_into_view_if_needed()
    page.wait_for_function(
        """() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-OutputArea'))
                  .some(el => el.innerText.includes('[rank3]'))""", timeout=60_000)
    ARTIFACTS.mkdir(exist_ok=True)
    first.screenshot(path=str(ARTIFACTS / "launch_cell.png"))
    page.close()


def test_a_chinese_lesson_runs_in_a_chinese_jupyterlab(browser: Any, chinese_lab: str) -> None:
    """notebooks/zh/ as a Chinese learner meets it: JupyterLab's menus in Chinese (the language pack),
    the lesson's text in Chinese, and its cells running from that folder (the scripts they save and
    the records they read are reached through the folder's links to the English ones)."""
    page = open_notebook(browser, chinese_lab, "zh/00_cards_and_launching.ipynb")
    page.wait_for_function("() => document.querySelector('#jp-menu-panel, .lm-MenuBar') "
                           "&& document.querySelector('.lm-MenuBar').innerText.includes('文件')", timeout=60_000)
    cells = run_all(page)
    unexpected = [cell["source"][:80] for cell in cells if errors(cell) and "raises-exception" not in cell["tags"]]
    assert not unexpected, f"cells errored in the browser: {unexpected}"
    launches = [cell for cell in cells if cell["source"].startswith("%%torchrun") and not errors(cell)]
    assert launches and all("[rank3]" in text_of(cell["outputs"]) for cell in launches[:2])
    staged = [errors(cell)[0]["evalue"] for cell in cells if "raises-exception" in cell["tags"]
              and cell["source"].startswith("%%torchrun")]
    assert staged and "（共 4 个）" in staged[0] and "其余 rank 已被停止" in staged[0], staged  # explained in Chinese
    title = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0).sharedModel.getSource()")
    assert title.startswith("# 00 · ") and "四张卡" in title
    page.close()


def test_lesson_02_widget_renders_and_follows_its_slider(browser: Any, lab: str) -> None:
    page = open_notebook(browser, lab, "02_data_parallelism_by_hand.ipynb")
    cells = run_all(page)
    unexpected = [cell["source"][:80] for cell in cells if errors(cell) and "raises-exception" not in cell["tags"]]
    assert not unexpected, f"cells errored in the browser: {unexpected}"
    widget_cell = page.locator(".jp-CodeCell", has=page.locator(".widget-slider")).first
    widget_cell.scroll_into_view_if_needed()
    slider = widget_cell.locator(".widget-slider").first
    slider.wait_for(timeout=60_000)
    output = widget_cell.locator(".widget-output, .jupyter-widgets-output-area").first
    before = output.inner_text()
    assert before.strip(), "the widget shows no output"
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    handle.focus()
    for _ in range(5):
        handle.press("ArrowRight")
    page.wait_for_function(
        """([el, before]) => el.innerText !== before""", arg=[output.element_handle(), before], timeout=60_000)
    assert output.inner_text() != before
    ARTIFACTS.mkdir(exist_ok=True)
    widget_cell.screenshot(path=str(ARTIFACTS / "widget.png"))
    page.close()
