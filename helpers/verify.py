"""Check cells: the checks that prove what a sentence, caption or listing claims, kept beside the text
but out of the reader's way.

A check cell wraps its checks in ``with verify("Figure 9.2.1"):``. Inside, each check prints one line,
either a fact that the notebook's comparison holds to its stored value (``scores from -1.5 to 1.1``) or
a verdict ending in ``True`` or ``False`` (several verdicts may share a line, each ending where a ``;``
follows); ``same(label, got, want)`` prints ``label: got`` and fails unless ``got == want``. When the block ends the cell shows
one short line, "✓ Figure 9.2.1: 4 checks hold" (with "; 2 more values below" when some lines are values, not
verdicts: a reader cannot see those compared), with every line folded beneath it; when a check fails
it shows, in red and unfolded, which one, with what it got against what was expected. Nothing is raised,
so the rest of the notebook still runs. The lines stay in the cell's output (text and HTML), where a
notebook comparison reads them like any printed line.
"""

import contextlib
import html
import io
import re

# A verdict: True or False ending the line, or a part of it before ";"; not an argument (`is_causal=True`) or an
# item of a printed list (`[True, False]`).
VERDICT = re.compile(r"(?<![\w=\[])(?<!, )\b(True|False)(?=\W*(;|$))")


class Checks:
    """The lines one check cell printed, and the checks among them that failed."""

    def __init__(self, title):
        self.title = title
        self.lines = []
        self.failed = []              # (line, detail)
        self.compared = []            # the lines same() printed: checks, though they end in no verdict

    def same(self, label, got, want):
        """Print ``label: got``; the check fails unless ``got == want``."""
        print(f"{label}: {got}")
        self.compared.append(f"{label}: {got}".splitlines()[0].rstrip())
        if not got == want:
            self.failed.append((f"{label}: {got}", f"expected {want!r}, got {got!r}"))

    @property
    def held(self):
        return not self.failed

    @property
    def count(self):
        """The checks: each verdict, and each line ``same`` printed."""
        return sum(len(VERDICT.findall(line)) or (line in self.compared) for line in self.lines)

    @property
    def values(self):
        """The other lines: values shown, which only the stored notebook's comparison holds."""
        return sum(not VERDICT.findall(line) and line not in self.compared for line in self.lines)

    def summary(self):
        n, more = self.count, self.values
        if self.held:
            said = f"{n} check{'s' if n != 1 else ''} hold{'' if n != 1 else 's'}"
            values = f"{more} value{'s' if more != 1 else ''}"
            return f"✓ {self.title}: " + (f"{said}; {more} more {values.split(' ', 1)[1]} below" if n and more
                                           else said if n else f"{values} below")
        return f"✗ {self.title}: {len(self.failed)} of {n} checks failed"

    def __repr__(self):
        body = [self.summary()]
        body += [f"  FAILED {line}  ({detail})" for line, detail in self.failed]
        body += [f"  {line}" for line in self.lines]
        return "\n".join(body)

    def _repr_html_(self):
        lines = "\n".join(html.escape(line) for line in self.lines)
        if self.held:
            return (f'<details class="book-checks"><summary>{html.escape(self.summary())}</summary>'
                    f"<pre>{lines}</pre></details>")
        failed = "\n".join(f"{html.escape(line)}\n    {html.escape(detail)}" for line, detail in self.failed)
        return (f'<div class="book-checks-failed" style="border: 2px solid #c0392b; padding: 0.4em;">'
                f'<strong style="color: #c0392b;">{html.escape(self.summary())}</strong>'
                f"<pre>{failed}</pre><details open><summary>every line</summary><pre>{lines}</pre></details></div>")


@contextlib.contextmanager
def verify(title):
    """Collect what the block prints as the checks of one check cell, then show them (see the module)."""
    from IPython.display import display

    checks = Checks(str(title))
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield checks
    finally:
        checks.lines = [line.rstrip() for line in buffer.getvalue().splitlines() if line.strip()]
        for line in checks.lines:
            if "False" in (v for v, _ in VERDICT.findall(line)) and line not in (f for f, _ in checks.failed):
                checks.failed.append((line, "expected True"))
        display(checks)
