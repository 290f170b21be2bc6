#!/usr/bin/env python3
"""test-serve-page.py - the chat page of `starinfer serve` in headless Chromium
(Debian's package), driven over the DevTools protocol on a pipe: the test
types a question into the page, presses Enter, waits for the streamed
answer, and checks the DOM. The answer must equal the API's answer to the
same message, and the stats line must show tokens/s. A screenshot is kept in
tests/logs/test-serve-page.png. It skips, with the reason, without chromium.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Failures, Server, synth  # noqa: E402

chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if chromium is None:
    print("SKIP: chromium is not installed (Debian: apt-get install chromium)")
    sys.exit(77)


class Browser:
    """Chromium with --remote-debugging-pipe: commands on fd 3, replies on fd 4,
    each a JSON message ending in a NUL byte."""

    def __init__(self, profile):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        # the child's fd 3 reads our commands, its fd 4 writes the replies
        self.p = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--remote-debugging-pipe",
             "--user-data-dir=" + profile, "--window-size=1000,800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4),
            preexec_fn=lambda: self._child_fds(to_r, from_w))
        os.close(to_r)
        os.close(from_w)
        self.next_id, self.buf, self.session = 0, b"", None

    @staticmethod
    def _child_fds(r, w):
        # above 4 first, so that neither lands on the other's target
        r2, w2 = os.dup(r), os.dup(w)
        while min(r2, w2) <= 4:
            r2, w2 = os.dup(r2), os.dup(w2)
        os.dup2(r2, 3)
        os.dup2(w2, 4)

    def send(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise RuntimeError(f"{method}: no reply in {timeout} s")

    def eval(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return r.get("result", {}).get("value")

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except (RuntimeError, OSError):
            pass
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


f = Failures()
tmp = tempfile.mkdtemp(prefix="si-test-serve-page-")
model = os.environ.get("STARINFER_TEST_MODEL")
if not model or not os.path.exists(model):
    model = os.path.join(tmp, "tiny.gguf")
    synth(model, "--preset", "tiny", "--type", "f16", "--seed", "5")
s = Server("-m", model, "--temp", "0", "-n", "40", "-c", "512")
question = "What is the capital of France? Answer in one sentence."
st, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": question}]})
want = r["choices"][0]["message"]["content"] if st == 200 else None
f.check(want is not None, f"the API's answer: {st} {r}")

b = Browser(os.path.join(tmp, "profile"))
try:
    targets = b.send("Target.getTargets", session=False)["targetInfos"]
    page = next(t for t in targets if t["type"] == "page")
    b.session = b.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True},
                       session=False)["sessionId"]
    b.send("Page.enable")
    b.send("Page.navigate", {"url": f"http://127.0.0.1:{s.port}/"})
    deadline = time.time() + 30
    while time.time() < deadline and b.eval("document.readyState") != "complete":
        time.sleep(0.1)
    deadline = time.time() + 30
    while time.time() < deadline and "context" not in (b.eval(
            "document.getElementById('model').textContent") or ""):
        time.sleep(0.1)
    f.check("context 512 tokens" in b.eval("document.getElementById('model').textContent"),
            "the page shows the model from /v1/models")
    # type the question as a user does, then Enter
    b.eval("document.getElementById('input').focus()")
    b.send("Input.insertText", {"text": question})
    for kind in ("keyDown", "keyUp"):
        b.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                          "windowsVirtualKeyCode": 13})
    deadline = time.time() + 120
    while time.time() < deadline and not b.eval("!!document.querySelector('.stats[data-done]')"):
        time.sleep(0.2)
    user = b.eval("Array.from(document.querySelectorAll('.msg.user')).map(e => e.textContent)")
    answer = b.eval("Array.from(document.querySelectorAll('.msg.assistant')).map(e => e.textContent)")
    stats = b.eval("document.querySelector('.stats') && document.querySelector('.stats').textContent")
    errors = b.eval("document.querySelectorAll('.msg.error').length")
    print("page:", user, answer, stats)
    f.check(user == [question], f"the question in the DOM: {user}")
    f.check(answer == [want], f"the streamed answer in the DOM {answer} != the API's {want!r}")
    f.check(errors == 0 and stats and "tokens/s" in stats, f"the stats line: {stats!r}")
    f.check(b.eval("document.getElementById('input').value") == "" and
            b.eval("document.getElementById('send').disabled") is False and
            b.eval("document.getElementById('stop').disabled") is True,
            "the form is ready for the next question")
    shot = b.send("Page.captureScreenshot", {"format": "png"})
    out = os.path.join(os.environ.get("builddir", "."), "tests", "logs")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "test-serve-page.png"), "wb") as fp:
        fp.write(base64.b64decode(shot["data"]))
    print("screenshot:", os.path.join(out, "test-serve-page.png"))
finally:
    b.close()
    s.stop()
    shutil.rmtree(tmp, ignore_errors=True)
f.exit()
