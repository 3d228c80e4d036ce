"""Checks tokenizer/testdata/chat/*.txt against Python's jinja2, rendered the
way Hugging Face's apply_chat_template renders (trim_blocks, lstrip_blocks,
raise_exception, loopcontrols), so the Go Jinja engine's output is known to
match the reference engine. Optional: needs python3 with jinja2.

Usage: python3 tools/tokgolden/chat_check.py [tokenizer/testdata/chat]
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """Hugging Face's tojson filter for chat templates."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def check(name, got, path):
    want = open(path, encoding="utf-8", newline="").read()
    print(f"{name}: {'ok' if got == want else 'MISMATCH'}")
    if got != want:
        print("  jinja2:", repr(got))
        print("  golden:", repr(want))
    return got != want


def check_tools(env, chat):
    """tools.json: a conversation with tools, parallel calls and their results, the
    messages given as each template's probed capabilities say (arguments as objects or
    text, content none or empty)."""
    d = json.load(open(os.path.join(chat, "tools.json"), encoding="utf-8"))
    failed = 0
    for c in d["cases"]:
        caps = c["caps"]
        msgs = json.loads(json.dumps(d["messages"]))
        if c.get("single"):
            # one call a turn (Llama 3.1): the others and their results left out
            dropped = set()
            for m in msgs:
                for tc in (m.get("tool_calls") or [])[1:]:
                    dropped.add(tc["id"])
                if m.get("tool_calls"):
                    m["tool_calls"] = m["tool_calls"][:1]
            msgs = [m for m in msgs if m.get("tool_call_id") not in dropped]
        for m in msgs:
            if m.get("tool_calls"):
                if m["content"] == "" and caps["NullContent"]:
                    m["content"] = None
                for tc in m["tool_calls"]:
                    if caps["ObjectArguments"]:
                        tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        src = open(os.path.join(chat, c["name"] + ".jinja"), encoding="utf-8").read()
        # The date the Go test renders with (toolsNow).
        now = datetime.datetime(2026, 1, 2, 15, 4, 5)
        got = env.from_string(src).render(messages=msgs, tools=d["tools"], add_generation_prompt=True,
                                          bos_token=c["bos"], eos_token=c["eos"],
                                          strftime_now=lambda f: now.strftime(f))
        failed += check(c["name"] + " with tools", got, os.path.join(chat, c["name"] + ".tools.txt"))
    return len(d["cases"]), failed


def check_harmony(env, chat):
    """gpt-oss's built-in format (Go's, since gonja cannot parse its template) against its
    template: the plain conversation, and one with the tools, a call and its results."""
    now = datetime.datetime(2026, 1, 2, 15, 4, 5)
    src = open(os.path.join(chat, "gptoss.jinja"), encoding="utf-8").read()
    plain = json.load(open(os.path.join(chat, "cases.json"), encoding="utf-8"))["messages"]
    d = json.load(open(os.path.join(chat, "tools.json"), encoding="utf-8"))
    msgs, tools = d["messages"], d["tools"]
    dropped = set()
    for m in msgs:
        for tc in (m.get("tool_calls") or [])[1:]:
            dropped.add(tc["id"])
        if m.get("tool_calls"):
            m["tool_calls"] = m["tool_calls"][:1]
            for tc in m["tool_calls"]:
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    msgs = [m for m in msgs if m.get("tool_call_id") not in dropped]
    failed = 0
    for name, conv, tl in (("gptoss.txt", plain, None), ("gptoss.tools.txt", msgs, tools)):
        got = env.from_string(src).render(messages=conv, add_generation_prompt=True, tools=tl,
                                          strftime_now=lambda f: now.strftime(f))
        failed += check("harmony " + name, got, os.path.join(chat, name))
    return 2, failed


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    chat = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tokenizer", "testdata", "chat")
    cases = json.load(open(os.path.join(chat, "cases.json"), encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    messages = cases["messages"]
    failed = 0
    for c in cases["cases"]:
        src = open(os.path.join(chat, c["name"] + ".jinja"), encoding="utf-8").read()
        got = env.from_string(src).render(messages=messages, add_generation_prompt=True,
                                          bos_token=c["bos"], eos_token=c["eos"])
        failed += check(c["name"], got, os.path.join(chat, c["name"] + ".txt"))
    n, f = check_tools(env, chat)
    n2, f2 = check_harmony(env, chat)
    total = len(cases["cases"]) + n + n2
    failed += f + f2
    print(f"{total - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
