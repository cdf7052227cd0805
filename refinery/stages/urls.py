"""URL host matching shared by the heuristic URL rules and the safety filter.

The host is read the way a browser reads it (the WHATWG URL standard), so that a URL cannot reach
a blocked site while its host reads as something else here:
- a URL without a scheme (`blocked.com/a//b`, `blocked.com/r?to=https://x.org`) is a host and a
  path, whatever `//` comes later; `http:`, `https:`, `ftp:`, `ws:`, `wss:` and `file:` take any
  number of `/` or `\\` before the host (`https:/blocked.com`, `http:\\\\blocked.com`);
- the host ends at the first `/`, `\\`, `?` or `#`; user-info ends at the last `@`
  (`user:pass@host`); a port follows the first `:` (or the `]` of an IPv6 literal);
- percent-escapes are decoded, Unicode host names are mapped (UTS #46: case, full-width dots) and
  written as punycode (`bücher.example` is `xn--bcher-kva.example`), trailing dots dropped;
- IPv4 hosts are read in every form a browser accepts (`0x7f.1`, `2130706433` are `127.0.0.1`) and
  IPv6 literals compressed (`[0:0::1]` is `::1`).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote

import idna

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
# The WHATWG "special" schemes: the host follows the colon after any run of slashes and backslashes.
_SPECIAL_SCHEMES = frozenset({"http", "https", "ftp", "ws", "wss", "file"})
_AUTHORITY_END = re.compile(r"[/\\?#]")
# Browsers drop tabs and newlines anywhere in a URL, and C0 controls and spaces around it.
_TAB_OR_NEWLINE = re.compile(r"[\t\n\r]")
_C0_OR_SPACE = "".join(map(chr, range(0x21)))


def url_authority(url: str) -> str:
    """The `user:pass@host:port` part of `url`; a URL without a scheme is read as one starting
    with its host (`example.com:8080/a` is host `example.com`, port 8080)."""
    url = _TAB_OR_NEWLINE.sub("", url.strip(_C0_OR_SPACE))
    scheme = _SCHEME.match(url)
    if scheme and scheme.group(1).lower() in _SPECIAL_SCHEMES:
        rest = url[scheme.end():].lstrip("/\\")
    elif scheme and url.startswith("//", scheme.end()):
        rest = url[scheme.end() + 2:]
    else:
        # No scheme: `example.com:8080` reads as scheme `example.com` to urlsplit, so only a
        # scheme followed by `//` (or a special one) counts; a leading `//` is protocol-relative.
        rest = url.lstrip("/\\")
    return _AUTHORITY_END.split(rest, maxsplit=1)[0]


def _ipv4_part(part: str) -> int | None:
    """One part of a WHATWG IPv4 host: decimal, `0x` hex or leading-zero octal; None if not a number."""
    base = 10
    if part[:2].lower() == "0x":
        base, part = 16, part[2:]
    elif len(part) > 1 and part.startswith("0"):
        base, part = 8, part[1:]
    if not part:
        return 0
    try:
        return int(part, base) if part.isascii() and part.isalnum() else None
    except ValueError:
        return None


def numeric_ipv4(host: str) -> str | None:
    """`host` as a dotted-quad IPv4 address when a browser reads it as one (its last label is a
    number: `127.1`, `0x7f.0.0.1`, `2130706433`); None when it is a domain name or not a valid address."""
    parts = host.split(".")
    last = parts[-1]
    if not (last.isdigit() or last[:2].lower() == "0x") or _ipv4_part(last) is None or len(parts) > 4:
        return None  # a name (its last label is no number): the common case, decided first
    numbers = [_ipv4_part(p) if p else None for p in parts]
    if None in numbers or any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(parts)):
        return None
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def canonical_host(host: str) -> str:
    """`host` as a browser resolves it: percent-decoded, UTS #46 mapped, punycode, no trailing dot,
    numeric IPv4 forms dotted."""
    host = unquote(host)
    if not host.isascii():
        host = idna.uts46_remap(host, std3_rules=False, transitional=False)
        labels = []
        for label in host.split("."):
            try:
                labels.append(label if label.isascii() else idna.alabel(label).decode("ascii"))
            except (idna.IDNAError, UnicodeError):
                labels.append(label)  # not a valid IDN label: compared as written
        host = ".".join(labels)
    host = host.rstrip(".").lower()
    return numeric_ipv4(host) or host


def url_host(url: str) -> str:
    """The canonical host of `url` (see the module docstring; "" when it has none). Raises
    ValueError for a URL whose host cannot be read (`http://[bad/x`)."""
    hostport = url_authority(url).rpartition("@")[2]
    if hostport.startswith("["):
        literal, bracket, _ = hostport[1:].partition("]")
        try:
            if not bracket:
                raise ValueError(literal)
            return ipaddress.IPv6Address(unquote(literal)).compressed
        except ValueError:
            raise ValueError("Invalid IPv6 URL") from None
    return canonical_host(hostport.partition(":")[0])


def _is_address(host: str) -> bool:
    return ":" in host or host.rpartition(".")[2].isdigit()  # no top-level domain is all digits


def _unicode_label(label: str) -> str:
    try:
        return idna.ulabel(label)
    except (idna.IDNAError, UnicodeError):
        return label  # not valid punycode: compared as written


def _unicode_form(host: str) -> str:
    """The Unicode spelling of a punycode host, so a blocklist may name it either way."""
    if "xn--" not in host:
        return host
    return ".".join(_unicode_label(label) if label.startswith("xn--") else label for label in host.split("."))


def blocked_suffix(host: str | None, blocked: frozenset[str]) -> str | None:
    """The blocked domain that `host` is, or is a subdomain of (`ads.example.com` matches
    `example.com`, `notexample.com` does not); None when it is neither. A blocked name may be
    written in punycode or in Unicode; an IP address matches only itself."""
    if not host:
        return None
    if _is_address(host):
        return host if host in blocked else None
    for form in dict.fromkeys((host, _unicode_form(host))):
        labels = form.split(".")
        for i in range(len(labels)):
            suffix = ".".join(labels[i:])
            if suffix in blocked:
                return suffix
    return None
