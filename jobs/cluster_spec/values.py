"""Kubernetes value formats, checked as the API server checks them: DNS-1123 names, label keys and
values, resource quantities, pinned image references."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
IMAGE_REF = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


def dns_label(value: str, what: str = "name") -> str:
    if len(value) > 63 or not DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid {what} (DNS-1123 label): use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit"
        )
    return value


def dns_subdomain(value: str, what: str = "name") -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a valid {what} (DNS-1123 subdomain): use lowercase letters, digits, '-' "
            "and '.', starting and ending with a letter or digit"
        )
    return value


def qualified_name(key: str) -> bool:
    """A label or annotation key: [prefix/]name, name <= 63 chars, prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(QUALIFIED_NAME.match(name))


def label_value(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ('500m', '16Gi', '2') as a number."""
    text = str(value)
    match = QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)")
    suffix = match.group(3) or ""
    number = text[: len(text) - len(suffix)] if suffix in _SUFFIXES else text
    try:
        base = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)") from None
    return base * Decimal(_SUFFIXES[suffix]) if suffix in _SUFFIXES else base


def image_reference(value: str, what: str) -> str:
    """A pinned image: `name:tag`, or (what production should use: a tag can be moved, a digest
    cannot) `name@sha256:<64 hex>` or `name:tag@sha256:<64 hex>`."""
    if "@" in value:
        digest = value.rsplit("@", 1)[1]
        if not re.fullmatch(r"sha256:[a-f0-9]{64}", digest):
            raise ValueError(f"{value!r}: a digest is sha256: and 64 lowercase hex digits (as `docker buildx "
                             f"imagetools inspect` or `crane digest` print it), got {digest!r}")
    match = IMAGE_REF.match(value)
    if not match:
        raise ValueError(f"{value!r} is not an image reference like registry/name:tag")
    if not match.group("digest") and match.group("tag") in (None, "latest"):
        raise ValueError(f"{value!r}: pin the {what} image by tag or digest (not untagged or :latest)")
    return value
