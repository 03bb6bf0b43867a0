"""Which imagePullPolicy each image gets: the rule thicket renders by.

- pinned by digest (`name@sha256:...`): IfNotPresent. A digest names one image for ever; a node's
  copy is the same bytes.
- a release version tag (`1.4.2`, `v0.33.0`, `0.9.1-cu124`): IfNotPresent. Registries and their
  publishers (thicket's release workflow, vLLM's) never move a release tag.
- any other tag (`main`, `nightly`, `0.2.0.dev3`, a branch name): Always. Such a tag moves; with
  IfNotPresent each node would run whatever it cached first, so the pods of one sweep could run
  different code. Always costs one manifest request per pod start; unchanged layers are not pulled
  again (https://kubernetes.io/docs/concepts/containers/images/#image-pull-policy).

`cluster.images.pull_policy` set in the spec overrides the rule for every image. Production should
pin by digest: `docker buildx imagetools inspect IMAGE` prints it.
"""

from __future__ import annotations

import re
from enum import Enum

VERSION_TAG = re.compile(r"^v?\d+(?:\.\d+)+(?:[-+][a-z0-9][a-z0-9._-]*)?$")
MOVING_WORDS = ("dev", "nightly", "snapshot", "latest", "main", "master", "edge")


class PullPolicy(str, Enum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


def is_release_tag(tag: str) -> bool:
    return bool(VERSION_TAG.match(tag)) and not any(word in tag.lower() for word in MOVING_WORDS)


def pull_policy(image: str, explicit: PullPolicy | None = None) -> PullPolicy:
    """The image's policy: `explicit` if set, else by how it is pinned (the module's rule)."""
    if explicit is not None:
        return PullPolicy(explicit)
    if "@sha256:" in image:
        return PullPolicy.IF_NOT_PRESENT
    name = image.rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else ""
    return PullPolicy.IF_NOT_PRESENT if is_release_tag(tag) else PullPolicy.ALWAYS
