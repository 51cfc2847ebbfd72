"""The docs run: every fenced Python and shell block of README.md and docs/*.md, as written.

A reader pastes a page's Python blocks into one session and its commands into one shell, in
the order the page gives them, from the root of a checkout. So, per file: the ```python blocks
run in order in one namespace, and the ```sh / ```bash / ```shell / ```console blocks with
bash (``$ `` prompts stripped, output lines of a console block ignored), both in one
temporary directory that holds links to the checkout's examples/, benchmarks/ and .venv/,
with .venv/bin first on PATH so that `kiln` and `python` are the checkout's.

A block that cannot run here says why, on the line before its fence:
``<!-- not run: needs a GPU -->``. A marker without a reason fails the test. A block whose
text the page asks the reader to save, ``<!-- save as: main.c -->``, is written to that file
when its turn comes. A block that needs tools kiln's own setup may not have installed
(``<!-- needs: aarch64-linux-gnu-gcc qemu-aarch64 -->``, what `make cross-tools` installs where
apt can) runs where they are on PATH and is counted as not run elsewhere. Blocks with any other
fence (```c, ```text, a bare ```) are text:
outputs, IR, file layouts.

ResNet-18 at 224x224 compiles in about 7 s on a cold cache and its weights are 47 MB, so the
default run makes the README's model with ``examples/make_resnet18.py --small`` (the same
network on 32x32 images); ``-m slow`` runs the README exactly as written.
"""

from __future__ import annotations

import linecache
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The docs whose default run uses `make_resnet18.py --small` (the others run as written).
SMALL_MODEL = [p for p in DOCS if "examples/make_resnet18.py" in p.read_text()]
VENV_BIN = REPO / ".venv" / "bin"

PYTHON = {"python", "py", "python3"}
SHELL = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run\b\s*:?\s*(?P<reason>.*?)\s*-->\s*$")
NEEDS = re.compile(r"^\s*<!--\s*needs:\s*(?P<tools>[\w. -]+?)\s*-->\s*$")
SAVE_AS = re.compile(r"^\s*<!--\s*save as:\s*(?P<name>[\w./-]+)\s*-->\s*$")
# Lines a test must not run: `make demo` / `make test` set up .venv and run the whole suite
# (the test is already running inside it), `pip install` changes the environment under the
# tests, and `git clone` fetches the repository we are in. Everything else runs.
SETUP_LINE = re.compile(r"^\s*(make\b|pip3? install\b|python3? -m pip install\b|git clone\b)")


@dataclass
class Block:
    path: Path
    index: int          # the n-th fenced block of the file, from 1
    line: int           # the line of its opening fence, from 1
    lang: str
    source: str
    not_run: str | None  # the reason, when marked
    save_as: str | None = None

    @property
    def where(self) -> str:
        first = next((s for s in self.source.splitlines() if s.strip()), "")
        return (f"{self.path.relative_to(REPO)}:{self.line}: block {self.index} "
                f"(```{self.lang}): {first.strip()!r}")


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the not-run marker before it, if any."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m["indent"], m["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker, save, needs = NOT_RUN.match(before), SAVE_AS.match(before), NEEDS.match(before)
        missing = [t for t in needs["tools"].split() if not shutil.which(t)] if needs else []
        lang = info.split()[0].lower() if info else ""
        found.append(Block(path, len(found) + 1, start + 1, lang, "\n".join(body) + "\n",
                           marker["reason"] if marker
                           else f"needs {', '.join(missing)}, not installed" if missing else None,
                           save["name"] if save else None))
    return found


def shell_script(block: Block) -> str:
    """The commands of a shell block, setup lines (SETUP_LINE) turned into no-ops."""
    out = []
    for line in block.source.splitlines():
        if block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if SETUP_LINE.match(line):
            line = f": not run by tests/test_docs.py: {line.strip()!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def run_shell(block: Block, cwd: Path, env: dict[str, str], small: bool) -> None:
    script = shell_script(block)
    if small:
        script = script.replace("examples/make_resnet18.py", "examples/make_resnet18.py --small")
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"{block.where} exited with status {done.returncode}\n--- script\n{script}"
                    f"--- stdout\n{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}",
                    pytrace=False)


def _session(conn: Connection, cwd: str, env: dict[str, str]) -> None:
    """A reader's Python session: runs the blocks it is sent, in one namespace, in ``cwd``."""
    os.chdir(cwd)
    os.environ.update(env)
    namespace: dict = {"__name__": "__main__"}
    while (job := conn.recv()) is not None:
        filename, source = job
        # @kiln.script reads its function's source, as from a script file or a notebook
        # cell: linecache is where inspect finds the source of code that has no file.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            exec(compile(source, filename, "exec"), namespace)
            conn.send(None)
        except BaseException:
            conn.send(traceback.format_exc())
        sys.stdout.flush()


class PythonSession:
    """A Python process of its own per file, so that what the docs do to kiln's process state
    (a pass registered, a thread count set, a directory changed) stays out of the tests'."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_session, args=(child, str(cwd), env),
                                       daemon=True)
        self.process.start()

    def run(self, block: Block) -> None:
        self.conn.send((f"{block.path.name}:{block.line}", block.source))
        if not self.conn.poll(600):
            pytest.fail(f"{block.where} ran for more than 600 s", pytrace=False)
        error = self.conn.recv()
        if error is not None:
            pytest.fail(f"{block.where} raised\n{error}", pytrace=False)

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def check_doc(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture, small: bool) -> None:
    found = blocks(path)
    runnable = [b for b in found if b.lang in PYTHON | SHELL or b.save_as]
    unexplained = [b.where for b in found if b.not_run is not None and not b.not_run]
    assert not unexplained, f"a not-run marker needs a reason: {unexplained}"

    # The docs' commands run from the root of a checkout; the files they write go here.
    for name in ("examples", "benchmarks", ".venv"):
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    bin_dir = VENV_BIN if VENV_BIN.is_dir() else Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    session = PythonSession(tmp_path, env)
    try:
        ran, skipped, slow = run_blocks(runnable, session, tmp_path, env, small)
    finally:
        session.close()
    with capsys.disabled():
        print(f"\n{path.relative_to(REPO)}: {len(found)} fenced blocks, {len(runnable)} Python, "
              f"shell or saved: {ran} ran, {len(skipped)} not run"
              + "".join(f"\n  not run: {s}" for s in skipped)
              + "".join(f"\n  slow: {s}" for s in slow))


def run_blocks(runnable: list[Block], session: PythonSession, tmp_path: Path,
               env: dict[str, str], small: bool) -> tuple[int, list[str], list[str]]:
    """Runs the blocks in order; the number that ran, the ones not run, the slow ones."""
    ran, skipped, slow = 0, [], []
    for block in runnable:
        if block.not_run:
            skipped.append(f"{block.where}: {block.not_run}")
            continue
        start = time.perf_counter()
        if block.save_as:
            (tmp_path / block.save_as).write_text(block.source)
        elif block.lang in PYTHON:
            session.run(block)
        else:
            run_shell(block, tmp_path, env, small)
        ran += 1
        seconds = time.perf_counter() - start
        if seconds > 5:
            slow.append(f"{block.where}: {seconds:.1f} s")
    return ran, skipped, slow


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_doc_runs(path, tmp_path, capsys):
    check_doc(path, tmp_path, capsys, small=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", SMALL_MODEL, ids=[p.name for p in SMALL_MODEL])
def test_doc_runs_as_written(path, tmp_path, capsys):
    check_doc(path, tmp_path, capsys, small=False)


def test_blocks_are_found_with_their_markers(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n<!-- not run: needs a GPU -->\n\n```python\nimport gpu\n```\n"
                   "- item:\n  ```sh\n  kiln --help\n  ```\n```\nplain\n```\n"
                   "<!-- not run -->\n```bash\nmake demo\n```\n"
                   "<!-- save as: main.c -->\n```c\nint x;\n```\n")
    found = blocks(doc)
    assert [(b.lang, b.line, b.not_run) for b in found] == [
        ("python", 4, "needs a GPU"), ("sh", 8, None), ("", 11, None), ("bash", 15, ""),
        ("c", 19, None)]
    assert found[4].save_as == "main.c" and found[4].source == "int x;\n"
    assert found[1].source == "kiln --help\n"
    assert shell_script(found[3]) == ": not run by tests/test_docs.py: 'make demo'\n"
