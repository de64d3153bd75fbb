"""Credentials in URLs: found (a spec refuses them) and redacted (wherever rentune records a URL it did not
refuse: one from the environment, such as MLFLOW_TRACKING_URI or RENTUNE_METADATA_URL, written to a
tracking.json, a checkpoint manifest or a log line).

A credential is `user[:password]@` before the host, or a parameter whose name looks like one, wherever a
URL can carry parameters: the query (`?a=1&b=2` or `?a=1;b=2`), the fragment (`#token=...`, as OAuth's
implicit flow puts it) and the path's own parameters (`/path;token=...`).
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["credential_in", "redact", "redact_text"]

# Parameter names that carry a credential: ?token=, ?api_key=, ?X-Amz-Signature=, ?sig= (Azure SAS),
# ?pwd=, ?pass=, ?session=, ...
_CREDENTIAL_NAME = re.compile(
    r"token|key|secret|signature|^sig$|password|passwd|^pwd$|^pass$|credential|auth|session|jwt|bearer|^x-amz-",
    re.I,
)
_PARAM = re.compile(r"(?P<name>[^=&;#?/]+)=(?P<value>[^&;#]*)")  # one name=value of a query or fragment
_PATH_PARAM = re.compile(r";(?P<name>[^=&;#?/]+)=(?P<value>[^&;#?/]*)")  # /path;name=value (not /key=1/)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{}]*(?:\[[0-9a-f:.]*\][^\s'\"<>()]*)?", re.I)
REDACTED = "REDACTED"


def _split(url: str) -> tuple[str, str, str, str, str]:
    """(scheme://, netloc, path, ?query, #fragment), with no parsing that could fail on a malformed URL:
    redaction must work on anything a log line holds."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url, "", ""
    netloc_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, rest = rest[:netloc_end], rest[netloc_end:]
    rest, hash_, fragment = rest.partition("#")
    path, mark, query = rest.partition("?")
    return scheme + sep, netloc, path, mark + query, hash_ + fragment


def _names(pattern: re.Pattern, text: str) -> list[str]:
    names = (urllib.parse.unquote(m["name"]) for m in pattern.finditer(text))
    return [name for name in names if _CREDENTIAL_NAME.search(name)]


def credential_in(url: str) -> str | None:
    """What in `url` is a credential ("user[:password]@", or "the parameter 'token'"), None if nothing."""
    scheme, netloc, path, query, fragment = _split(url)
    if not scheme:
        return None
    if "@" in netloc:
        return "user[:password]@"
    names = _names(_PATH_PARAM, path) + _names(_PARAM, query) + _names(_PARAM, fragment)
    return f"the parameter {names[0]!r}" if names else None


def _hide(match: re.Match) -> str:
    if _CREDENTIAL_NAME.search(urllib.parse.unquote(match["name"])):
        return match[0][: match.start("value") - match.start()] + REDACTED
    return match[0]


def redact(url: str) -> str:
    """`url` with its user[:password]@ removed and the value of every credential-like parameter replaced by
    REDACTED (the names stay: they say what was there)."""
    scheme, netloc, path, query, fragment = _split(url)
    if not scheme:
        return url
    netloc = netloc.rpartition("@")[2]
    return scheme + netloc + _PATH_PARAM.sub(_hide, path) + _PARAM.sub(_hide, query) + _PARAM.sub(_hide, fragment)


def redact_text(text: str) -> str:
    """`text` (a log line, an error message) with every URL in it redacted."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact(m[0]), text)
