#!/usr/bin/env python3
"""test-serve-openai.py - `starinfer serve` through OpenAI's own Python client
(PyPI's openai, in the venv tools/install-deps makes: STARINFER_CLIENT_PYTHON),
on the real model SmolLM2 (STARINFER_TEST_MODEL): chat, plain and streamed,
greedy, equal to each other and to `starinfer generate --chat`; a completion;
the model list; an error the client raises as its own exception type.
Skips, with the reason, without the package or the model."""
import os
import subprocess
import sys

client_python = os.environ.get("STARINFER_CLIENT_PYTHON")
try:
    import openai
except ImportError:
    if client_python and os.path.exists(client_python) and \
            not os.environ.get("SI_SERVE_OPENAI_REEXEC"):
        os.environ["SI_SERVE_OPENAI_REEXEC"] = "1"
        os.execv(client_python, [client_python, *sys.argv])
    print("SKIP: the openai package is not installed (tools/install-deps makes its venv: "
          "STARINFER_CLIENT_PYTHON)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Failures, Server, generate  # noqa: E402

model = os.environ.get("STARINFER_TEST_MODEL")
if not model or not os.path.exists(model):
    print("SKIP: STARINFER_TEST_MODEL (SmolLM2) is not set; tools/install-deps fetches it")
    sys.exit(77)

f = Failures()
s = Server("-m", model, "--parallel", "2", "-c", "512", "--api-key", "k-test", "--alias", "smol")
c = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="k-test", max_retries=0)
question = "What is the capital of France? Answer in one sentence."
msgs = [{"role": "user", "content": question}]

models = c.models.list()
f.check([m.id for m in models.data] == ["smol"], f"models: {models}")

r = c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=40, seed=1)
answer = r.choices[0].message.content
print("chat:", repr(answer), r.choices[0].finish_reason, r.usage)
f.check(r.object == "chat.completion" and r.choices[0].message.role == "assistant" and
        answer and r.usage.completion_tokens > 0 and
        r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
        f"chat completion: {r}")
want = generate(model, question, 40, "--chat", "-c", "512")
want = want[want.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
f.check(answer == want, f"chat {answer!r} != generate --chat {want!r}")

parts, usage, finish = [], None, None
for ch in c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=40,
                                    stream=True, stream_options={"include_usage": True}):
    if ch.usage is not None:
        usage = ch.usage
    for choice in ch.choices:
        if choice.delta.content:
            parts.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
print(f"streamed: {len(parts)} chunks, finish {finish}, usage {usage}")
f.check("".join(parts) == answer and len(parts) > 1 and finish == r.choices[0].finish_reason and
        usage is not None and usage.completion_tokens == r.usage.completion_tokens,
        f"streamed chat {''.join(parts)!r} ({len(parts)} chunks, {finish}, {usage}) != {answer!r}")

# the next turn: the slot's cache holds the conversation so far (the prompt
# and the answer), only the new turn is evaluated; the answer is the same as
# from scratch (cache_prompt false)
msgs2 = msgs + [{"role": "assistant", "content": answer},
                {"role": "user", "content": "And of Italy?"}]
r2 = c.chat.completions.create(model="smol", messages=msgs2, temperature=0, max_tokens=40)
r3 = c.chat.completions.create(model="smol", messages=msgs2, temperature=0, max_tokens=40,
                               extra_body={"cache_prompt": False})
cached = r2.usage.prompt_tokens_details.cached_tokens
print(f"second turn: {r2.choices[0].message.content!r}, {cached} of {r2.usage.prompt_tokens} "
      "prompt tokens from the cache")
f.check(cached > r.usage.prompt_tokens and r3.usage.prompt_tokens_details.cached_tokens == 0 and
        r2.choices[0].message.content == r3.choices[0].message.content,
        f"second turn: {r2} vs from scratch {r3}")

r = c.completions.create(model="smol", prompt="The capital of France is", max_tokens=8,
                         temperature=0)
print("completion:", repr(r.choices[0].text))
f.check(r.object == "text_completion" and r.choices[0].text ==
        generate(model, "The capital of France is", 8, "-c", "512")[len("The capital of France is"):],
        f"completion: {r}")

try:
    c.chat.completions.create(model="smol", messages=msgs, temperature=7)
    f.check(False, "temperature 7 was accepted")
except openai.BadRequestError as e:
    print("ok: temperature 7 ->", e.status_code, e.body)
    f.check(e.status_code == 400 and "temperature" in str(e.body), f"error body: {e.body}")
try:
    openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="wrong",
                  max_retries=0).models.list()
    f.check(False, "a wrong key was accepted")
except openai.AuthenticationError as e:
    print("ok: a wrong key ->", e.status_code)

f.check(s.stop() == 0, "serve's exit status")
f.exit()
