"""The string patterns of the API (and the rule built from them), written once for pydantic
and the CRD alike. Pure.

Every pattern is RE2-compatible (no lookaround), since the API server evaluates a CRD's
`pattern` and CEL's `matches()` with RE2; pydantic's default regex engine has the same
restriction, so a pattern that works here works in the cluster.
"""

from __future__ import annotations

import re

from kubeinfer.contract.api_model import CrossFieldRule

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A Service's name: a DNS-1123 label that starts with a letter."""
_SUBDOMAIN_BODY = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS1123_SUBDOMAIN = rf"^{_SUBDOMAIN_BODY}$"
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
QUALIFIED_NAME = rf"^({_SUBDOMAIN_BODY}/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
"""A label or annotation key: an optional DNS subdomain prefix and `/`, then a name."""
SHA256_HEX = r"^[0-9a-f]{64}$"
ENGINE_DIGEST = r"^sha256:[0-9a-f]{64}$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"
MODEL_URI = r"^(file|https?|s3|gs|pvc)://.+$"

_SEGMENT = r"([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+)"
"""One path segment other than `.` and `..` (RE2 has no lookahead, hence three cases)."""
PVC_URI = rf"^pvc://{_SUBDOMAIN_BODY}/{_SEGMENT}(/{_SEGMENT})*$"
"""pvc://CLAIM/PATH: the claim a DNS-1123 subdomain, the path relative to the claim's
root with no `.`, `..` or empty segment, so the mount (/sources/CLAIM) and the file
inside it are what they say. The claim's 253-character limit is PVC_CLAIM_LENGTH."""
PVC_CLAIM_LENGTH = r"^pvc://[^/]{1,253}/"

PVC_URI_MESSAGE = (
    "a pvc:// URI is pvc://CLAIM/PATH: CLAIM a PersistentVolumeClaim's name (a DNS-1123 "
    "subdomain: lowercase letters, digits, '-' and '.', at most 253 characters) and PATH "
    "a relative file path without '.', '..' or empty segments"
)
PVC_URI_CEL = (
    "!self.uri.startsWith('pvc://') || "
    f"(self.uri.matches('{PVC_URI}') && self.uri.matches('{PVC_CLAIM_LENGTH}'))"
)


def valid_pvc_uri(uri: str) -> bool:
    """The pydantic twin of PVC_URI_CEL."""
    return not uri.startswith("pvc://") or (
        re.fullmatch(PVC_URI.strip("^$"), uri) is not None
        and re.match(PVC_CLAIM_LENGTH, uri) is not None
    )


PVC_URI_RULE = CrossFieldRule(
    cel=PVC_URI_CEL, message=PVC_URI_MESSAGE, field="uri", holds=lambda s: valid_pvc_uri(s.uri)
)
"""A pvc:// source names a claim and a file inside it, nothing outside (ModelSource and
CalibrationSpec): `pvc://../../etc/passwd` or an upper-case claim would become an invalid
claim name and mount path in the build Job."""
