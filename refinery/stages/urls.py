"""URL host matching shared by the heuristic URL rules and the safety filter."""

from __future__ import annotations

from urllib.parse import urlsplit


def url_host(url: str) -> str:
    """The lower-cased host of `url` without a trailing dot ("" when it has none); a URL written
    without a scheme (`example.com/a`) is read as a host and path. Raises ValueError for a URL
    that cannot be split (`http://[bad/x`)."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname
    return host.rstrip(".").lower() if host else ""


def blocked_suffix(host: str | None, blocked: frozenset[str]) -> str | None:
    """The blocked domain that `host` is, or is a subdomain of (`ads.example.com` matches
    `example.com`, `notexample.com` does not); None when it is neither."""
    if not host:
        return None
    labels = host.split(".")
    for i in range(len(labels)):
        suffix = ".".join(labels[i:])
        if suffix in blocked:
            return suffix
    return None
