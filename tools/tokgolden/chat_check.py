"""Checks tokenizer/testdata/chat/*.txt against Python's jinja2, rendered the
way Hugging Face's apply_chat_template renders (trim_blocks, lstrip_blocks,
raise_exception, loopcontrols), so the Go Jinja engine's output is known to
match the reference engine. Optional: needs python3 with jinja2.

Usage: python3 tools/tokgolden/chat_check.py [tokenizer/testdata/chat]
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    chat = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tokenizer", "testdata", "chat")
    cases = json.load(open(os.path.join(chat, "cases.json"), encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    messages = cases["messages"]
    failed = 0
    for c in cases["cases"]:
        src = open(os.path.join(chat, c["name"] + ".jinja"), encoding="utf-8").read()
        got = env.from_string(src).render(messages=messages, add_generation_prompt=True,
                                          bos_token=c["bos"], eos_token=c["eos"])
        want = open(os.path.join(chat, c["name"] + ".txt"), encoding="utf-8", newline="").read()
        status = "ok" if got == want else "MISMATCH"
        failed += got != want
        print(f"{c['name']}: {status}")
        if got != want:
            print("  jinja2:", repr(got))
            print("  golden:", repr(want))
    print(f"{len(cases['cases']) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
