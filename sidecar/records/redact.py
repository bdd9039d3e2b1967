"""Secrets out of the command lines and URLs the sidecar writes or logs (issue 26, item 1).

A vLLM command line carries `--api-key sk-...`, `--hf-token hf_...`, an `HF_TOKEN=... vllm serve`
prefix or a URL with a password; the sidecar stores titles in every summary, py-spy prints the
command line at the top of each dump, and discovery logs titles. The values of secret-bearing
flags and variables, URL user info and secret query parameters are replaced by `REDACTED` where
the command line enters the sidecar (/proc and py-spy's output), so nothing downstream holds them.
A name is secret-bearing when it says key, token, secret, password, passwd, credential or auth.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "REDACTED"
# A part of a name, between `-`, `_` or `.`: `--api-key`, `--hf-token`, `OPENAI_API_KEY`,
# `DB.password`, but not `--tokenizer-mode` or `--max-num-batched-tokens`.
_SECRET_PART = re.compile(
    r"(?i)(?:^|[-_.])(?:key|token|secret|password|passwd|pwd|credentials?|auth|apikey)(?:$|[-_.])"
)
_NAME = r"[A-Za-z_][\w.-]*"
_FLAG_EQ = re.compile(rf"(?P<name>--?{_NAME})=(?P<value>.+)")
_FLAG = re.compile(rf"--?{_NAME}")
_ASSIGN = re.compile(rf"(?P<name>{_NAME})=(?P<value>.+)")
# scheme://user:password@host, scheme://token@host; ?token=...&sig=...
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]*://)(?P<userinfo>[^/\s@]+)@")
_QUERY = re.compile(r"(?P<key>[?&](?P<name>[\w.-]+)=)(?P<value>[^&\s\"';]+)")
# The same over free text (a py-spy dump's `Process PID: CMDLINE`, a raw record's frame).
_TEXT_FLAG = re.compile(
    rf"(?P<name>(?<![\w-])--?{_NAME})(?P<sep>=|[ \t]+)(?P<value>(?!-)[^\s\"';]+)"
)
_TEXT_ASSIGN = re.compile(rf"(?P<name>(?<![\w.-]){_NAME})=(?P<value>[^\s\"';]+)")


def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or parameter name says it holds a secret."""
    return _SECRET_PART.search(name.lstrip("-")) is not None


def redact_url(url: str) -> str:
    """User info and secret query parameters of every URL in `url` (or in a longer text)."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", url)
    return _QUERY.sub(
        lambda m: (
            f"{m['key']}{REDACTED}"
            if is_secret_name(m["name"]) or m["name"].lower() in _QUERY_SECRETS
            else m[0]
        ),
        text,
    )


# Query parameters that carry a credential without saying so: pre-signed URLs' signatures.
_QUERY_SECRETS = frozenset(
    {"sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token"}
)


def redact_args(args: Sequence[str]) -> tuple[str, ...]:
    """A command line (argv) with the values of its secret-bearing flags and variables hidden."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if (m := _FLAG_EQ.fullmatch(arg)) and is_secret_name(m["name"]):
            out.append(f"{m['name']}={REDACTED}")
        elif _FLAG.fullmatch(arg) and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        elif (m := _ASSIGN.fullmatch(arg)) and is_secret_name(m["name"]):
            out.append(f"{m['name']}={REDACTED}")
        else:
            out.append(redact_url(arg))
    return tuple(out)


def redact_text(text: str) -> str:
    """The same over free text: a dump or a log line that quotes a command line."""
    text = _TEXT_FLAG.sub(
        lambda m: f"{m['name']}{m['sep']}{REDACTED}" if is_secret_name(m["name"]) else m[0], text
    )
    text = _TEXT_ASSIGN.sub(
        lambda m: f"{m['name']}={REDACTED}" if is_secret_name(m["name"]) else m[0], text
    )
    return redact_url(text)
