#!/usr/bin/env python3
"""test-serve.py - `starinfer serve` over loopback with the standard library's
HTTP client (docs/server.md):

1. the command's refusals, one line each;
2. on a tiny synthetic model with 2 slots: completions and chat, plain and
   streamed, equal to what `starinfer generate` prints for the same prompt
   (greedy); stop sequences; usage counts; /v1/models, /health, /metrics,
   /tokenize, /detokenize and the chat page;
3. every error status: 400 (malformed JSON, wrong type or range, unknown
   token, prompt over the context, with OpenAI's error object), 404, 405,
   413 (--max-body), 401 (--api-key);
4. 8 clients x 5 requests at once on 4 slots sharing one engine: none
   fails, each answer equals its single-client answer; then the load test
   (8 x 20, twice, RSS flat); and on a Q4_0 model, whose steps take the
   batched int8 kernels (--batch-arith auto) or decoding's dots (exact);
5. on a slower model with 1 slot and a queue of 1: a third request gets 503;
   a streaming client that leaves frees the slot for the queued one;
6. SIGTERM with a request in flight: the server ends it and exits 0.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import SI, Failures, Server, generate, synth  # noqa: E402

f = Failures()
tmp = tempfile.mkdtemp(prefix="si-test-serve-")
tiny = os.path.join(tmp, "tiny.gguf")
synth(tiny, "--preset", "tiny", "--type", "f16", "--seed", "5")


def refused(args, needle):
    r = subprocess.run([SI, "serve", *args], capture_output=True, timeout=60)
    err = r.stderr.decode().strip()
    ok = f.check(r.returncode == 1 and len(err.splitlines()) == 1 and needle in err,
                 f"serve {' '.join(args)}: exit {r.returncode}, stderr {err!r}, wanted {needle!r}")
    if ok:
        print("ok: serve", " ".join(args), "->", err)


# ---------------------------------------------------------- 1. refusals
refused([], "no model given")
refused(["-m", tiny, "--port", "70000"], "--port")
refused(["-m", tiny, "--parallel", "0"], "--parallel")
refused(["-m", tiny, "-p", "hi"], "prompts come in requests")
refused(["-m", tiny, "--bogus"], "unknown option '--bogus'")
refused(["-m", tiny, "--max-body", "lots"], "--max-body")
refused(["-m", os.path.join(tmp, "none.gguf")], "No such file")
refused(["-m", tiny, "--host", "no.such.host.invalid"], "--host")
busy = socket.socket()
busy.bind(("127.0.0.1", 0))
busy.listen(1)
refused(["-m", tiny, "--port", str(busy.getsockname()[1])], "cannot listen")
busy.close()

# ---------------------------------------------------------- 2. the API
s = Server("-m", tiny, "--parallel", "2", "--temp", "0", "-c", "256")
prompts = ["hello world", "the cat", "one two three", "zebra", "a b c d e f", "starinfer",
           "x", "the quick brown fox"]
want = {p: generate(tiny, p, 12, "-c", "256", "--ignore-eos")[len(p):] for p in prompts}

st, r = s.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 12, "ignore_eos": True})
f.check(st == 200 and r["object"] == "text_completion" and r["choices"][0]["text"] == want[prompts[0]],
        f"completion: {st} {r}, wanted text {want[prompts[0]]!r}")
f.check(st == 200 and r["usage"]["completion_tokens"] == 12 and r["choices"][0]["finish_reason"] == "length"
        and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 12, f"completion usage: {r}")
st, ev = s.stream("/v1/completions", {"prompt": prompts[1], "max_tokens": 12, "ignore_eos": True,
                                      "stream": True})
text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]" and e["choices"])
f.check(st == 200 and ev[-1] == "[DONE]" and text == want[prompts[1]],
        f"streamed completion: {st} {text!r}, wanted {want[prompts[1]]!r}")

chat_want = generate(tiny, "hi there", 10, "-c", "256", "--chat", "--ignore-eos")
chat_want = chat_want[chat_want.rindex("<|im_start|>assistant\n") + 22:]
msgs = [{"role": "user", "content": "hi there"}]
st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "ignore_eos": True})
f.check(st == 200 and r["object"] == "chat.completion" and
        r["choices"][0]["message"] == {"role": "assistant", "content": chat_want},
        f"chat: {st} {r}, wanted {chat_want!r}")
st, ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "ignore_eos": True,
                                           "stream": True, "stream_options": {"include_usage": True}})
deltas = [e for e in ev if e != "[DONE]" and e["choices"]]
text = "".join(e["choices"][0]["delta"].get("content", "") for e in deltas)
f.check(st == 200 and deltas[0]["choices"][0]["delta"].get("role") == "assistant" and
        deltas[-1]["choices"][0]["finish_reason"] == "length" and text == chat_want and
        ev[-2].get("usage", {}).get("completion_tokens") == 10 and ev[-1] == "[DONE]" and
        all(e["object"] == "chat.completion.chunk" for e in ev if e != "[DONE]"),
        f"streamed chat: {st} {ev}")

# the next turn of a conversation: the slot's cache holds its start (the turns
# before), only the rest is evaluated, and the answer is the one from scratch
turn1 = r["choices"][0]["message"]["content"]
msgs2 = msgs + [{"role": "assistant", "content": turn1}, {"role": "user", "content": "and then?"}]
st, r2 = s.post("/v1/chat/completions", {"messages": msgs2, "max_tokens": 8, "ignore_eos": True})
st, r3 = s.post("/v1/chat/completions", {"messages": msgs2, "max_tokens": 8, "ignore_eos": True,
                                         "cache_prompt": False})
c2 = r2.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", -1)
c3 = r3.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", -1)
f.check(st == 200 and c2 > 0 and c3 == 0 and
        r2["usage"]["prompt_tokens"] == r3["usage"]["prompt_tokens"] and
        r2["choices"][0]["message"] == r3["choices"][0]["message"],
        f"second turn: cached {c2} (from scratch {c3}), {r2.get('choices')} vs {r3.get('choices')}")
print(f"ok: a second turn reused {c2} of its {r2['usage']['prompt_tokens']} prompt tokens, "
      "same answer as from scratch")

# a stop sequence: the text ends before it, finish_reason stop
# (two ASCII characters past the first: the model's other bytes may not be
# UTF-8, and a stop sequence matches the bytes the model makes)
full, cut = None, None
for p in prompts:
    t = want[p]
    for i in range(1, len(t) - 1):
        if t[i].isascii() and t[i + 1].isascii() and t[i:i + 2] not in t[:i + 1]:
            full, cut = t, t[i:i + 2]
            prompts.remove(p)
            prompts.insert(2, p)
            break
    if cut:
        break
if f.check(cut is not None, f"no ASCII stop sequence to test in {want}"):
    st, r = s.post("/v1/completions", {"prompt": prompts[2], "max_tokens": 12, "stop": cut,
                                       "ignore_eos": True})
    f.check(st == 200 and r["choices"][0]["text"] == full[:full.index(cut)] and
            r["choices"][0]["finish_reason"] == "stop", f"stop {cut!r}: {r}, from {full!r}")
    st, ev = s.stream("/v1/completions", {"prompt": prompts[2], "max_tokens": 12, "stop": [cut],
                                          "stream": True, "ignore_eos": True})
    text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]" and e["choices"])
    f.check(text == full[:full.index(cut)], f"streamed stop {cut!r}: {text!r}")

st, _, r = s.request("GET", "/v1/models")
f.check(st == 200 and b'"id":"tiny"' in r and b'"n_ctx":256' in r, f"/v1/models: {st} {r}")
st, _, r = s.request("GET", "/health")
f.check(st == 200 and r == b'{"status":"ok"}', f"/health: {st} {r}")
st, h, r = s.request("GET", "/")
f.check(st == 200 and h.get("Content-Type", "").startswith("text/html") and b"<html" in r,
        f"/: {st} {h}")
f.check(b"http://" not in r and b"https://" not in r and b"//" not in r.split(b"<script>")[0],
        "the page names no other origin: it fetches nothing but this server")
st, r = s.post("/tokenize", {"content": "hello world"})
toks = r.get("tokens")
f.check(st == 200 and isinstance(toks, list) and len(toks) > 0, f"/tokenize: {st} {r}")
st, r = s.post("/detokenize", {"tokens": toks})
f.check(st == 200 and r.get("content") == "hello world", f"/detokenize: {st} {r}")
st, _, r = s.request("GET", "/metrics")
m = r.decode()
for name in ("starinfer_requests_total", "starinfer_requests_processing", "starinfer_requests_queued",
             "starinfer_tokens_generated_total", "starinfer_generation_tokens_per_second",
             "starinfer_prompt_tokens_cached_total",
             "starinfer_kv_cache_tokens{slot=\"1\"}", "starinfer_ffn_neurons_computed_ratio"):
    f.check(st == 200 and name in m, f"/metrics lacks {name}")

# ---------------------------------------------------------- 3. errors
def error(method, path, body, status, needle, param=None, headers=None):
    st, _, data = s.request(method, path, body, headers)
    try:
        e = json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        e = None
    ok = f.check(st == status and e is not None and needle in e["message"] and
                 (param is None or e.get("param") == param),
                 f"{method} {path} {body!r}: {st} {data[:300]!r}, wanted {status} with {needle!r}")
    if ok:
        print(f"ok: {method} {path} -> {st} {e['message']}")


error("POST", "/v1/completions", "{bad", 400, "malformed JSON")
error("POST", "/v1/completions", "[1]", 400, "JSON object")
error("POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "number", "temperature")
error("POST", "/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "between", "top_p")
error("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "between", "max_tokens")
error("POST", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "true or false", "stream")
error("POST", "/v1/completions", {"prompt": "x", "n": 3}, 400, "one choice", "n")
error("POST", "/v1/completions", {"prompt": "x", "stop": [""]}, 400, "non-empty", "stop")
error("POST", "/v1/completions", {"prompt": [1, 2, 99999]}, 400, "token id", "prompt")
error("POST", "/v1/completions", {"prompt": 7}, 400, "'prompt' must be", "prompt")
error("POST", "/v1/completions", {"prompt": "word " * 400}, 400, "leaves no room", "prompt")
error("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "non-empty array", "messages")
error("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
      "content must be", "messages")
error("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                       "presence_penalty": 0.5}, 400, "not supported")
error("POST", "/detokenize", {"tokens": [-4]}, 400, "token id", "tokens")
error("POST", "/nowhere", {}, 404, "no such route")
error("GET", "/v1/chat/completions", None, 405, "method not allowed")
st, _, r = s.request("POST", "/v1/completions", b"\xff\xfe{}")
f.check(st == 400, f"invalid UTF-8 body: {st} {r[:200]!r}")
s.stop()

s = Server("-m", tiny, "--api-key", "sesame", "--max-body", "2K", "-c", "256")
error("POST", "/v1/completions", {"prompt": "x"}, 401, "API key")
error("POST", "/v1/completions", {"prompt": "x"}, 401, "API key", headers={"Authorization": "Bearer nope"})
error("GET", "/v1/models", None, 401, "API key")
st, r = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2},
               headers={"Authorization": "Bearer sesame"})
f.check(st == 200, f"with the key: {st} {r}")
f.check(s.request("GET", "/health")[0] == 200, "/health needs no key")
error("POST", "/v1/completions", "{" + " " * 4000 + "}", 413, "--max-body",
      headers={"Authorization": "Bearer sesame"})
f.check(s.stop() == 0, "serve with a key: exit status")

# ---------------------------------------------------------- 4. 8 clients at once
s = Server("-m", tiny, "--parallel", "4", "--queue", "64", "--temp", "0", "-c", "256")
alone = {}
for p in prompts:
    st, r = s.post("/v1/completions", {"prompt": p, "max_tokens": 12, "ignore_eos": True})
    alone[p] = r["choices"][0]["text"] if st == 200 else None
    f.check(alone[p] == want[p], f"{p!r} alone: {alone[p]!r}, generate: {want[p]!r}")
results, lock = [], threading.Lock()


def client(k, n=5):
    for i in range(n):
        p = prompts[(k + i) % len(prompts)]
        if (k + i) % 2:
            st, ev = s.stream("/v1/completions", {"prompt": p, "max_tokens": 12, "ignore_eos": True,
                                                  "stream": True})
            text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]" and e["choices"])
        else:
            st, r = s.post("/v1/completions", {"prompt": p, "max_tokens": 12, "ignore_eos": True})
            text = r["choices"][0]["text"] if st == 200 else None
        with lock:
            results.append((p, st, text))


threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
t0 = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join()
bad = [(p, st, t) for p, st, t in results if st != 200 or t != alone[p]]
f.check(len(results) == 40 and not bad, f"8 x 5 concurrent requests: {len(results)} answered, "
        f"wrong: {bad[:3]}")
print(f"ok: 8 clients x 5 requests in {time.time() - t0:.2f} s, each equal to its answer alone")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as fp:
        return next(int(ln.split()[1]) for ln in fp if ln.startswith("VmRSS:"))


# The load test: rounds of 8 clients x 20 requests. Nothing fails, and the
# rounds after the first leave the server's memory where the first did: a
# request that leaked its body buffer alone (4 KiB at least) would add
# 1,920 KiB over the 480 requests of three more rounds, past the 1,024 KiB
# allowed for the allocator's own moves (RSS after a round moved by -196 to
# +524 KiB from the one before without any leak: one round's 640 KiB of
# such a leak could not be told from them).  Under AddressSanitizer two
# rounds (below).
asan = b"libasan" in subprocess.run(["ldd", SI], capture_output=True).stdout
rounds = []
for _ in range(2 if asan else 4):
    results.clear()
    threads = [threading.Thread(target=client, args=(k, 20)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [(p, st, t) for p, st, t in results if st != 200 or t != alone[p]]
    f.check(len(results) == 160 and not bad, f"8 x 20 requests: {len(results)}, wrong: {bad[:3]}")
    rounds.append(rss_kib(s.p.pid))
# (AddressSanitizer keeps freed blocks in quarantine, so RSS grows by
# design there; LeakSanitizer checks for leaks at the server's exit instead,
# which the exit status below sees)
if asan:
    print(f"note: RSS not compared under AddressSanitizer (its quarantine): {rounds} KiB")
else:
    f.check(rounds[-1] - rounds[0] < 1024, f"RSS after each round of 160 requests: {rounds} KiB")
print(f"ok: {len(rounds)} rounds of 8 clients x 20 requests, none failed; RSS after each {rounds} KiB")
f.check(s.stop() == 0, "exit status after the load")

# ---------------------------------------------------------- 4b. Q4_0: the batched kernels' steps
# (the F16 model above has no batched kernel: its steps take decoding's dots
# either way).  Each answer on 4 slots at once equals its answer alone.
q4 = os.path.join(tmp, "q4.gguf")
synth(q4, "--preset", "tiny", "--type", "q4_0", "--seed", "6")
for arith in ("auto", "exact"):
    s = Server("-m", q4, "--parallel", "4", "--temp", "0", "-c", "256", "--batch-arith", arith)
    alone = {}
    for p in prompts:
        st, r = s.post("/v1/completions", {"prompt": p, "max_tokens": 12, "ignore_eos": True})
        alone[p] = r["choices"][0]["text"] if st == 200 else None
    results.clear()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [(p, st, t) for p, st, t in results if st != 200 or t != alone[p]]
    f.check(len(results) == 40 and not bad and None not in alone.values(),
            f"Q4_0, --batch-arith {arith}: 8 x 5 requests: {len(results)}, wrong: {bad[:3]}")
    f.check(s.stop() == 0, f"Q4_0, --batch-arith {arith}: exit status")
    print(f"ok: Q4_0 on 4 slots, --batch-arith {arith}: 8 clients x 5 requests, each equal to "
          "its answer alone")

# ---------------------------------------------------------- 5. queue full, a client that leaves
slow = os.path.join(tmp, "slow.gguf")
synth(slow, "--preset", "tiny", "--n-embd", "768", "--n-ff", "3072", "--n-layer", "8",
      "--n-ctx", "4096", "--type", "q8_0")
s = Server("-m", slow, "--engine", "ref", "--parallel", "1", "--queue", "1", "-c", "4096")
long_body = ('{"prompt":"hello","max_tokens":4000,"ignore_eos":true,"stream":true}').encode()
a = socket.create_connection(("127.0.0.1", s.port))
a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: " + str(len(long_body)).encode() + b"\r\n\r\n" + long_body)
first = a.recv(4096)  # the headers: A is queued, and soon holds the slot
f.check(b"200 OK" in first, f"long stream: {first[:200]!r}")


def metric(name):
    for ln in s.request("GET", "/metrics")[2].decode().splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    return None


deadline = time.time() + 10
while time.time() < deadline and not (metric("starinfer_requests_processing") == 1 and
                                      metric("starinfer_requests_queued") == 0):
    time.sleep(0.02)
queued = {}


def queued_client():
    t = time.time()
    queued["st"], queued["r"] = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
    queued["s"] = time.time() - t


qt = threading.Thread(target=queued_client)
qt.start()
deadline = time.time() + 10
while time.time() < deadline and metric("starinfer_requests_queued") != 1:
    time.sleep(0.02)
st, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
f.check(st == 503 and "queue is full" in r.get("error", {}).get("message", ""),
        f"third request with the slot and queue taken: {st} {r}")
time.sleep(0.3)
a.close()  # the streaming client leaves: its job stops, the queued one runs
qt.join(60)
f.check(queued.get("st") == 200 and queued.get("s", 99) < 15,
        f"queued request after the stream's client left: {queued}")
gen = metric("starinfer_tokens_generated_total")
f.check(gen is not None and gen < 3000, f"the abandoned stream stopped early: {gen} tokens")
print(f"ok: 503 with the queue full; the queued request answered {queued.get('s', 0):.2f} s "
      f"after it came, once the streaming client left (the stream stopped at {gen} tokens)")

# ---------------------------------------------------------- 6. SIGTERM with a request in flight
holder = {}
ht = threading.Thread(target=lambda: holder.update(
    r=s.post("/v1/completions", {"prompt": "hello", "max_tokens": 4000, "ignore_eos": True})))
ht.start()
time.sleep(0.5)
t = time.time()
rc = s.stop()
ht.join(30)
f.check(rc == 0 and time.time() - t < 20, f"SIGTERM mid-request: exit {rc} after {time.time() - t:.1f} s")
st, r = holder.get("r", (None, None))
f.check(st == 200 and 0 < r["usage"]["completion_tokens"] < 4000,
        f"the request in flight at SIGTERM is answered with what it had: {st} {r}")
f.check("stopping" in s.stderr(), f"serve's stderr: {s.stderr()!r}")
print(f"ok: SIGTERM with a request in flight: exit {rc}, the request answered {st}")

# ---------------------------------------------------------- 7. tools/bench-serve runs
bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "bench-serve")
r = subprocess.run([sys.executable, bench, "-m", tiny, "--concurrency", "1,2", "-n", "4",
                    "--prompt-tokens", "8"], capture_output=True, text=True, timeout=300)
rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| 1 | starinfer") or
        ln.startswith("| 2 | starinfer")]
f.check(r.returncode == 0 and len(rows) == 2, f"bench-serve: exit {r.returncode}, {r.stdout!r} "
        f"{r.stderr[-500:]!r}")

subprocess.run(["rm", "-rf", tmp])
f.exit()
