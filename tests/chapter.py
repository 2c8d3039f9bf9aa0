"""Execute the chapter's notebooks outside pytest's own nbval run: for the determinism and offline
checks (tests/test_chapter.py) and for the execution report (tests/bench.py).

Each notebook runs in a fresh kernel, in its own folder, inside a child process so that its
environment (thread count, network namespace) can be set and its memory measured.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import nbformat
from nbval.plugin import coalesce_streams, find_comment_markers, find_metadata_tags


class Run(NamedTuple):
    nb: object          # the executed notebook (without the cell ``after``)
    seconds: float      # the notebook's cells, not counting ``after``
    mib: float          # peak memory of the kernel's process tree, each page counted once (PSS; tree_memory)
    after: str          # what the cell ``after`` printed ("" without one)
    rss_mib: float = 0  # the peak of the processes' resident sizes added up (a page they share, once each)
COMPARED = ("text/plain", "text/html", "text/markdown", "text/latex", "image/svg+xml", "application/json")


def comparable(nb):
    """What nbval compares, cell by cell: stdout and text results; no stderr, no PNG."""
    result = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        markers = dict(find_comment_markers(cell.source)) | dict(find_metadata_tags(cell.metadata))
        if markers.get("check", True) is False or markers.get("skip"):
            result.append(None)                            # NBVAL_IGNORE_OUTPUT / NBVAL_SKIP
            continue
        texts = []
        for out in coalesce_streams([nbformat.from_dict(o) for o in cell.outputs]):
            if out.output_type == "stream" and out.name == "stdout":
                texts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                texts += [f"{k}: {v}" for k, v in sorted(out.data.items()) if k in COMPARED]
            elif out.output_type == "error":
                texts.append(f"error: {out.ename}: {out.evalue}")
        result.append(texts)
    return result


def offline_prefix():
    """A command prefix that runs its command with no network but loopback, or None if unavailable."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True)
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "offline"] if probe.returncode == 0 else None


def execute(path, threads=None, offline=False, timeout=600, variables=None, after=None):
    """Execute notebook ``path`` in a fresh kernel; return a ``Run`` (notebook, seconds, peak MiB, after).

    ``threads=1`` runs with ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``. ``offline=True``
    runs it in a network namespace that has only loopback (or, where the kernel does not allow
    that, with a socket guard that refuses every address but loopback). ``variables`` are set in the
    kernel's environment: ``{"ATEN_CPU_CAPABILITY": "default"}`` simulates a CPU without AVX. ``after``,
    code, runs in the same kernel once the notebook has run (not timed, not in the returned notebook);
    its stdout is returned, so one execution serves a check that needs the kernel Run All left.
    """
    env = dict(os.environ) | dict(variables or {})
    # Figures go to a scratch folder: a re-execution must not rewrite the committed ones. It is made
    # only when BOOK_FIGURES is not set, and removed afterwards; set empty, nothing is written (a reader's run).
    scratch = None if "BOOK_FIGURES" in env else tempfile.mkdtemp(prefix="book-figures-")
    if scratch:
        env["BOOK_FIGURES"] = scratch
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, str(path), str(threads or 0), str(timeout), json.dumps(after)]
    if offline:
        prefix = offline_prefix()
        command = [*prefix, *command] if prefix else [*command, "guard"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout + 60)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"executing {Path(path).name} failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.splitlines()[-1])
    return Run(nbformat.reads(report["notebook"], as_version=4), report["seconds"], report["peak_mib"], report["after"],
               report["peak_rss_mib"])


# Run first in the kernel where unshare is unavailable: refuse every connection but loopback.
GUARD = """
import socket as _socket
_connect = _socket.socket.connect
def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and not (host.startswith("127.") or host in ("::1", "localhost")):
        raise OSError(f"network disabled for this test: {address!r}")
    return _connect(self, address)
_socket.socket.connect = _loopback_only
"""


# With BOOK_REBIND set: the hook of tests/rebind.py, as `_rebind` (test_chapter.py reads `_rebind.rebound()`).
REBIND = """
import importlib.util as _spec_util
_spec = _spec_util.spec_from_file_location("book_rebind", r"{path}")
_rebind = _spec_util.module_from_spec(_spec)
_spec.loader.exec_module(_rebind)
"""


def tree_memory(processes, peak, last, every=1.0):
    """Update ``peak["rss"]`` and ``peak["pss"]`` with the memory of ``processes`` now; return when PSS was last read.

    A notebook's memory is its kernel's and that of the processes it starts (9.4's race workers) together. Their
    resident sizes (RSS) added up count a page they share (torch's libraries, mapped by each) once per process;
    a memory limit such as Binder's 2 GiB (a cgroup's) counts it once. The proportional set size (PSS) divides
    each shared page among the processes that map it, so its sum counts every page once: that is the peak
    reported. Reading PSS costs some milliseconds per process (the kernel walks its pages), against
    microseconds for RSS, so it is read only when it could be a new peak (PSS <= RSS, so only when the RSS sum
    exceeds the PSS peak), at a new RSS peak or ``every`` seconds at most. Where PSS is unavailable, RSS stands in.
    """
    import psutil

    rss, alive = 0, []
    for p in processes:
        try:
            rss += p.memory_info().rss
            alive.append(p)
        except psutil.Error:
            pass
    now, new_high = time.monotonic(), rss > peak["rss"]
    peak["rss"] = max(peak["rss"], rss)
    if rss > peak["pss"] and (new_high or now - last >= every):
        pss = 0
        for p in alive:
            try:
                pss += getattr(p.memory_full_info(), "pss", None) or p.memory_info().rss
            except psutil.Error:
                pass
        peak["pss"], last = max(peak["pss"], pss), now
    return last


def _child(path, threads, timeout, after, guard):
    """In the child process: execute the notebook, sampling the memory of the kernel's process tree."""
    import psutil
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    setup = []
    if threads:
        setup.append(nbformat.v4.new_code_cell(f"import torch; torch.set_num_threads({threads})"))
    if guard:
        setup.append(nbformat.v4.new_code_cell(GUARD))
    if os.environ.get("BOOK_REBIND"):             # last, so that it notes the notebook's cells only
        setup.append(nbformat.v4.new_code_cell(REBIND.format(path=Path(__file__).with_name("rebind.py"))))
    nb.cells = setup + nb.cells
    me, peak, running = psutil.Process(), {"pss": 0, "rss": 0}, [True]

    def sample():
        last = 0.0
        while running[0]:
            last = tree_memory(me.children(recursive=True), peak, last)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(Path(path).parent)}})
    printed = ""
    # NotebookClient.execute, written out so that a cell can run after the notebook in the same kernel.
    start = time.perf_counter()
    client.reset_execution_trackers()
    with client.setup_kernel():
        info = client.wait_for_reply(client.kc.kernel_info())
        nb.metadata["language_info"] = info["content"]["language_info"]
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i, execution_count=client.code_cells_executed + 1)
        client.set_widgets_metadata()
        seconds = time.perf_counter() - start
        running[0] = False
        if after is not None:
            probe = nbformat.v4.new_code_cell(after)
            nb.cells.append(probe)
            client.execute_cell(probe, len(nb.cells) - 1)
            nb.cells.pop()
            printed = "".join(o.get("text", "") for o in probe.outputs if o.output_type == "stream" and o.name == "stdout")
    sampler.join()
    nb.cells = nb.cells[len(setup):]
    print(json.dumps({"notebook": nbformat.writes(nb), "seconds": seconds, "peak_mib": peak["pss"] / 2**20,
                      "peak_rss_mib": peak["rss"] / 2**20, "after": printed}))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), len(sys.argv) > 5)
