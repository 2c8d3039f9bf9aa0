"""The notebooks in JupyterLab as a reader meets them (`make lab-test`; not part of `make test`).

Starts `jupyter lab` on a free loopback port with a token, on copies of the stored notebooks, and drives
it in headless Chromium (Debian's package, as book/test_site.py), with every request to another host
refused and the notebook's windowing off (every cell in the page, not only those in view).

- Opened unrun (untrusted, so JupyterLab sanitizes its html): every notebook shows each control as one
  frame with a line saying that running the cell makes it live, never a stack of frames, and no raw MyST
  (target lines such as `(sec-lookup)=`, roles, directives): jupyterlab-myst renders it.
- After Run All, in the real kernel: every control is moved through every state as a reader would (the
  slider dragged, the menu picked), and each move redraws it: the image changes, and no error shows.

The server is stopped at the end.
"""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CALL = re.compile(r"^control\(", re.M)
CONTROLS = {p.name: len(CALL.findall(p.with_suffix(".md").read_text())) for p in NOTEBOOKS}
CONTROLLED = [name for name, n in CONTROLS.items() if n]
TIMEOUT = 900_000                                        # ms: Run All of 9.4 (the race), on a busy 2-core machine
# MyST that must not show as text once rendered: target lines, roles, directive fences.
RAW_MYST = re.compile(r"^\([\w.:-]+\)=\s*$|\{[a-z:-]+\}`|^(```|:::)\{[a-z-]+\}", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`jupyter lab` on copies of the stored notebooks (so nothing the kernel or the lab writes lands in the repository)."""
    home = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", home / "notebooks", ignore=shutil.ignore_patterns("*.md"))
    # Every cell in the page, not only those in view (JupyterLab's default windowing detaches the rest).
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), secrets.token_hex(16)
    env = os.environ | {"PYTHONPATH": str(ROOT), "BOOK_FIGURES": str(home / "figures"), "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
                        "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=subprocess.DEVNULL, stderr=open(home / "lab.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {(home / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail(f"jupyter lab did not answer: {(home / 'lab.log').read_text()[-2000:]}")
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


# Waits for notebook `name`'s panel, its cells and its rendered markdown; marks each control cell's node
# (data-control=k) for the locators below; with `run`, runs every cell first (Run All) in the kernel.
OPEN = """async ([name, run]) => {
    const app = window.jupyterapp;
    await app.restored;
    const find = () => [...app.shell.widgets('main')].find(w => w.context && w.context.path.endsWith(name));
    let panel = find();
    while (!panel) { await new Promise(r => setTimeout(r, 200)); panel = find(); }
    await panel.context.ready;
    await panel.revealed;
    const notebook = panel.content;
    if (run) {
        await panel.sessionContext.ready;
        await app.commands.execute('notebook:run-all-cells');
    }
    const markdown = notebook.widgets.filter(c => c.model.type === 'markdown');
    while (!markdown.every(c => c.rendered && c.node.innerText.trim()))
        await new Promise(r => setTimeout(r, 200));
    let k = 0;
    notebook.widgets.forEach(c => { if (c.model.type === 'code' && /^control\\(/m.test(c.model.sharedModel.getSource()))
        c.node.setAttribute('data-control', k++); });
    return k;
}"""


# The TeX commands (\alpha, \|) in the rendered markdown's text, leaving out code and typeset math (KaTeX's,
# whose MathML keeps the TeX source).
TEX_SHOWN = r"""(() => [...document.querySelectorAll('.jp-MarkdownCell .myst')]             // jupyterlab-myst's rendering
    .flatMap(c => { const n = c.cloneNode(true); n.querySelectorAll('pre, code, .katex').forEach(e => e.remove());
                    return n.textContent.match(/\\[A-Za-z|{]+/g) || []; }))"""


def open_notebook(lab, browser, name, workspace):
    """A page on notebook `name` in a workspace of its own (reset, or the lab reopens earlier tabs)."""
    url, token = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    away = []

    def guard(route):
        if urlsplit(route.request.url).netloc == urlsplit(url).netloc or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            away.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/notebooks/{name}?reset&token={token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=120_000)
    return context, page, away


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_unrun_notebook_shows_one_frame_per_control_and_no_raw_myst(name, lab, browser):
    context, page, away = open_notebook(lab, browser, name, "unrun-" + name[:3].replace(".", "-"))
    try:
        assert page.evaluate(OPEN, [name, False]) == CONTROLS[name]
        for k in range(CONTROLS[name]):
            out = page.locator(f"[data-control='{k}'] .jp-OutputArea")
            assert out.locator(".book-frame").count() == 0, f"control {k}: a stack of frames"
            still = out.locator(".book-control-still")
            assert still.count() == 1, f"control {k}: no still frame"
            assert still.locator("img").count() == 1, f"control {k}: not one frame"
            assert "Run the notebook up to this cell to turn the control" in still.inner_text()
            still.locator("img").scroll_into_view_if_needed()
            page.wait_for_function("i => i.complete && i.naturalWidth > 100", arg=still.locator("img").element_handle())
        text = page.evaluate("""() => [...document.querySelectorAll('.jp-MarkdownCell')]
            .map(c => c.innerText).join('\\n')""")
        raw = RAW_MYST.findall(text)
        assert not raw, f"raw MyST shows in {name}: {raw[:5]}"
        assert "9." in text                              # the markdown did render
        # Every solution opened, no TeX source shows: all the math is typeset (jupyterlab-myst left the math
        # inside raw html, such as the <details> the solutions sat in before, as TeX without its dollars).
        rendered = page.evaluate("() => document.querySelectorAll('.jp-MarkdownCell .myst').length")
        assert rendered >= 10, f"{name}: {rendered} markdown cells rendered by jupyterlab-myst"   # the check below reads them
        page.evaluate("() => document.querySelectorAll('.jp-MarkdownCell details').forEach(d => { d.open = true; })")
        try:
            page.wait_for_function(f"() => !{TEX_SHOWN}().length", timeout=60_000)
        except PlaywrightTimeout:
            pytest.fail(f"TeX shows as text in {name}, untypeset: {page.evaluate(f'() => {TEX_SHOWN}()')[:5]}")
        assert not away, f"requests to other hosts: {away}"
    finally:
        context.close()


def frame_of(page, k):
    """What control k's live output shows: its images' sources and its text; None while it has no image."""
    return page.evaluate("""k => { const out = document.querySelector(`[data-control='${k}'] .widget-output`);
        if (!out || !out.querySelector('img')) return null;
        return [...out.querySelectorAll('img')].map(i => i.src).join() + out.innerText; }""", k)


ERROR = '[data-mime-type="application/vnd.jupyter.error"]'


def error_of(page, k):
    return page.evaluate(f"""k => {{ const out = document.querySelector(`[data-control='${{k}}'] .widget-output`);
        const e = out && out.querySelector('{ERROR}');
        return e ? e.innerText.slice(-600) : null; }}""", k)


def pick(page, cell, i, n):
    """Move control `cell` to state i of n as a reader would: pick it from the menu, or drag the handle there."""
    if cell.locator(".widget-dropdown select").count():
        cell.locator(".widget-dropdown select").select_option(index=i)
        return
    track = cell.locator(".noUi-target")
    track.scroll_into_view_if_needed()                   # the mouse reaches only what is in view
    box, handle = track.bounding_box(), cell.locator(".noUi-handle").bounding_box()
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * i / (n - 1), y, steps=8)
    page.mouse.up()


@pytest.mark.parametrize("name", CONTROLLED)
def test_after_run_all_every_control_redraws_every_state(name, lab, browser):
    context, page, away = open_notebook(lab, browser, name, "run-" + name[:3].replace(".", "-"))
    try:
        assert page.evaluate(OPEN, [name, True]) == CONTROLS[name]
        for k in range(CONTROLS[name]):
            cell = page.locator(f"[data-control='{k}']")
            cell.locator(".widget-slider, .widget-dropdown").first.wait_for(state="visible")
            page.wait_for_function("k => document.querySelector(`[data-control='${k}'] .widget-output img`)", arg=k)
            if cell.locator(".widget-dropdown select").count():
                select = cell.locator(".widget-dropdown select")
                n, now = select.locator("option").count(), select.evaluate("s => s.selectedIndex")
            else:
                handle = cell.locator(".noUi-handle")
                n, now = int(float(handle.get_attribute("aria-valuemax"))) + 1, int(float(handle.get_attribute("aria-valuenow")))
            seen = [frame_of(page, k)]
            for i in [*range(now - 1, -1, -1), *range(now + 1, n)]:   # down to the first state, then up to the last
                pick(page, cell, i, n)
                page.wait_for_function(f"""([k, before]) => {{
                    const out = document.querySelector(`[data-control='${{k}}'] .widget-output`);
                    if (!out) return false;
                    if (out.querySelector('{ERROR}')) return true;
                    const drawn = [...out.querySelectorAll('img')].map(i => i.src).join() + out.innerText;
                    return out.querySelector('img') && drawn !== before; }}""",
                                       arg=[k, seen[-1]])
                assert error_of(page, k) is None, f"control {k} raised: {error_of(page, k)}"
                seen.append(frame_of(page, k))
            assert len(set(seen)) == n, f"control {k}: {n} states, {len(set(seen))} different frames"
        assert not away, f"requests to other hosts: {away}"
    finally:
        context.close()
