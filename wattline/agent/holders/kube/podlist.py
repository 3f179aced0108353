"""The pod watcher's settings (``[kubernetes]``) and the node's pod list, fetched over HTTP(S).

Primary path: the kubelet's authenticated ``GET https://NODE_IP:10250/pods`` with the
agent's service account token (RBAC: ``get`` on ``nodes/proxy``, or ``nodes/pods`` where
the kubelet has fine-grained authorization): one request per poll to the node's own
kubelet, no API server load, and it lists exactly the pods of this node. The API server's
list, ``https://APISERVER/api/v1/pods?fieldSelector=spec.nodeName%3DNODE`` (RBAC: ``list``
on ``pods``, cluster-wide), returns the same ``PodList`` and works as ``pod_list_url`` too;
the read-only port 10255 (plain HTTP, off by default) works with ``token_file = ""``.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.holders.kube.pods import Pod, PodListError, parse_pod_list
from wattline.agent.holders.kube.settings import KubeSettings

#: Largest pod list read (a node's few hundred pods are a few MiB).
MAX_BYTES = 64 << 20


class PodSourceError(OSError):
    """The pod list could not be had, in one line."""


@dataclass
class PodList:
    """Fetches the node's pods from ``settings.pod_list_url``."""

    settings: KubeSettings
    timeout_s: float = 5.0

    def _context(self) -> ssl.SSLContext | None:
        if not self.settings.pod_list_url.startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=self.settings.ca_file or None)
        if not self.settings.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def fetch(self, known: Set[str] = frozenset(), listed: set[str] | None = None) -> list[Pod]:
        """The pods listed now, those of ``known`` uids left unparsed (see :func:`.pods.parse_pod_list`,
        also for ``listed``); PodSourceError (one line) when the list cannot be had."""
        url = self.settings.pod_list_url
        headers = {"Accept": "application/json"}
        if self.settings.token_file:
            try:  # read every time: projected tokens are rotated in place
                headers["Authorization"] = "Bearer " + Path(self.settings.token_file).read_text().strip()
            except OSError as exc:
                raise PodSourceError(f"token {self.settings.token_file}: {exc.strerror or exc}") from None
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context()) as reply:
                body = reply.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise PodSourceError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PodSourceError(f"{url}: {reason}") from None
        if len(body) > MAX_BYTES:
            raise PodSourceError(f"{url}: reply over {MAX_BYTES >> 20} MiB, not read")
        try:
            return parse_pod_list(json.loads(body), known, listed)
        except (ValueError, PodListError) as exc:
            raise PodSourceError(f"{url}: {str(exc)[:200]}") from None
