"""serve_util.py - what the server's tests share (not a test): the binary,
synthetic models, a running `starinfer serve` on a free loopback port, and
HTTP requests with the standard library only."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SI = os.environ.get("STARINFER")
if not SI:
    print("STARINFER must name the starinfer binary")
    sys.exit(1)


class Failures:
    def __init__(self):
        self.n = 0

    def check(self, cond, what):
        if not cond:
            print("FAIL:", what)
            self.n += 1
        return cond

    def exit(self):
        print(f"{self.n} failure(s)")
        sys.exit(1 if self.n else 0)


def synth(path, *args):
    subprocess.run([SI, "synth", "-o", path, "--measure", "0", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Server:
    """starinfer serve ARGS on 127.0.0.1, port chosen by the kernel."""

    def __init__(self, *args, env=None):
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([SI, "serve", "--port", "0", *args], stdout=subprocess.DEVNULL,
                                  stderr=self.err, env=env)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.p.poll() is None:
            m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", self.stderr_bytes())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("the server did not start: " + self.stderr())

    def stderr_bytes(self):
        self.err.seek(0)
        return self.err.read()

    def stderr(self):
        return self.stderr_bytes().decode(errors="replace")

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict, body bytes)"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, body, headers=None):
        status, _, data = self.request("POST", path, body, headers)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, {"raw": data.decode(errors="replace")}

    def stream(self, path, body, headers=None):
        """The events of a streamed response: (status, [parsed JSON or '[DONE]'])."""
        status, _, data = self.request("POST", path, body, headers)
        events = []
        for block in data.decode().split("\n\n"):
            if block.startswith("data: "):
                d = block[6:]
                events.append(d if d == "[DONE]" else json.loads(d))
        return status, events

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Stop it; its exit status (None if it had to be killed)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                return self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                return None
        return self.p.returncode


def generate(model, prompt, n, *extra):
    """What `starinfer generate` prints for prompt (greedy), as text: bytes that
    are not UTF-8 become U+FFFD as the server's JSON has them."""
    out = subprocess.run([SI, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
                          *extra], check=True, capture_output=True).stdout.decode(errors="replace")
    assert out.endswith("\n")
    return out[:-1]
