"""The controls live in JupyterLab (`make lab-test`; not part of `make test`).

Starts `jupyter lab` on a free loopback port with a token, on copies of the executed notebooks, and
opens each notebook that has a control in headless Chromium (Debian's package, as book/test_site.py),
with every request to another host refused. In each one it runs the cells up to the first control cell
and that cell, in the real kernel, moves the control as a reader would (drags the slider, or picks
another entry of the menu), and checks that the kernel redrew the output. The server is stopped at the end.
"""

import os
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

ROOT = Path(__file__).resolve().parents[1]
# One notebook per section with controls (helpers.controls).
CONTROLLED = ["9.1", "9.2", "9.3", "9.4", "9.5", "9.6"]
TIMEOUT = 600_000                                        # ms: the cells above a control, on a busy 2-core machine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`jupyter lab` on copies of the stored notebooks (so nothing the kernel or the lab writes lands in the repository)."""
    home = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", home / "notebooks", ignore=shutil.ignore_patterns("*.md"))
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


# In the panel of notebook `name`: runs the cells above the first control cell, then that cell; marks its
# node for the locators below.
RUN_TO_CONTROL = """async name => {
    const app = window.jupyterapp;
    await app.restored;
    const find = () => [...app.shell.widgets('main')].find(w => w.context && w.context.path.endsWith(name));
    let panel = find();
    while (!panel) { await new Promise(r => setTimeout(r, 200)); panel = find(); }
    await panel.context.ready;
    await panel.sessionContext.ready;
    const notebook = panel.content;
    const index = notebook.widgets.findIndex(c => c.model.type === 'code'
        && /^control\\(/m.test(c.model.sharedModel.getSource()));
    if (index < 0) return -1;
    notebook.activeCellIndex = index;
    if (index > 0) await app.commands.execute('notebook:run-all-above');
    notebook.activeCellIndex = index;
    await app.commands.execute('notebook:run-cell');
    notebook.widgets[index].node.setAttribute('data-control-cell', '');
    return index;
}"""


def drawn(page):
    """What the control's output area shows: its images' sources and its text."""
    return page.evaluate("""() => { const out = document.querySelector('[data-control-cell] .widget-output');
        return out ? [...out.querySelectorAll('img')].map(i => i.src).join() + out.innerText : null; }""")


@pytest.mark.parametrize("section", CONTROLLED)
def test_moving_a_control_redraws_in_the_kernel(section, lab, browser):
    url, token = lab
    name = next(p.name for p in (ROOT / "notebooks").glob(f"{section}-*.ipynb"))
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
    try:
        # A workspace of its own, reset: otherwise the lab reopens the tabs of the notebooks tested before.
        page.goto(f"{url}/lab/workspaces/{section.replace('.', '-')}/tree/notebooks/{name}?reset&token={token}")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=120_000)
        assert page.evaluate(RUN_TO_CONTROL, name) >= 0, f"{name} has no control cell"
        cell = page.locator("[data-control-cell]")
        picker = cell.locator(".widget-slider, .widget-dropdown").first
        picker.wait_for(state="visible")
        picker.scroll_into_view_if_needed()
        page.wait_for_function("() => document.querySelector('[data-control-cell] .widget-output img')")
        before = drawn(page)
        if cell.locator(".widget-dropdown select").count():
            select = cell.locator(".widget-dropdown select")
            chosen = select.evaluate("s => s.selectedIndex")
            select.select_option(index=(chosen + 1) % select.locator("option").count())
        else:                                            # drag the handle to the far end of the track
            cell.locator(".noUi-target").scroll_into_view_if_needed()     # the mouse reaches only what is in view
            track = cell.locator(".noUi-target").bounding_box()
            handle = cell.locator(".noUi-handle").bounding_box()
            x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
            end = track["x"] + track["width"] if x < track["x"] + track["width"] / 2 else track["x"]
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(end, y, steps=10)
            page.mouse.up()
        page.wait_for_function("""before => { const out = document.querySelector('[data-control-cell] .widget-output');
            if (!out || !out.querySelector('img')) return false;
            return [...out.querySelectorAll('img')].map(i => i.src).join() + out.innerText !== before; }""", arg=before)
        after = drawn(page)
        assert after and after != before and "data:image/png" in after
        assert not away, f"requests to other hosts: {away}"
    finally:
        context.close()
