"""The Kubernetes API as a pod sees it through its own service account: the API server's address from
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``, the token, the cluster's CA certificate and the pod's namespace
from the files the kubelet mounts (``/var/run/secrets/kubernetes.io/serviceaccount``).

It does one thing, create a namespaced object (``POST /apis/<group>/<version>/namespaces/<ns>/<plural>``), with
``requests`` rather than the ``kubernetes`` package: one documented REST call needs no generated client (the package
and its google-auth, oauthlib and websocket-client dependencies), and what the pod may call stays visible here, one
verb, which the chart's Role grants and nothing more. A creation is safe to retry: an object's name is the caller's, so
a retry whose first attempt reached the server gets 409 Conflict (AlreadyExists), which reports the object as there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import requests

from offline_training.errors import OfflineTrainingError

#: Where the kubelet mounts a pod's service account: ``token`` (rotated in place), ``ca.crt``, ``namespace``.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Answers worth another attempt: throttled, or the API server (or its etcd) briefly unavailable.
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
#: What to do about an answer that will not change on a retry.
_FIXES = {
    401: "the service account's token was refused: is it mounted (automountServiceAccountToken) and current?",
    403: "the pod's service account may not do this: grant it in the chart's Role for the retrain trigger",
    404: "the API server does not serve this resource: install its operator's CustomResourceDefinition (Kubeflow Trainer)",
    422: "the object is invalid for the installed CRD: compare the chart's template with its schema",
}


class KubernetesError(OfflineTrainingError, RuntimeError):
    """The API server could not be reached or refused a request; the message says what to do about it."""


@dataclass(frozen=True)
class Resource:
    """A namespaced resource of an API group (a custom resource's group, version and plural name)."""

    group: str
    version: str
    plural: str

    def collection(self, namespace: str) -> str:
        """The REST path of this resource's objects in ``namespace``."""
        return f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}"


@dataclass(frozen=True)
class Created:
    """An object the API server holds: ``created`` False when it was there already (a retried creation)."""

    name: str
    namespace: str
    created: bool


class KubernetesApi:
    """A client of one API server, authenticated by the bearer token in ``token_file`` (read at every request: bound
    service account tokens are rotated in place) and verifying the server's certificate with ``ca_file``.

    ``attempts`` bounds tries of one request when the connection fails or the server answers a ``RETRIED_STATUSES``
    code, ``backoff_s`` apart (doubling); ``timeout_s`` bounds connecting and each reply."""

    def __init__(
        self,
        server: str,
        namespace: str,
        token_file: Path,
        ca_file: Path,
        *,
        timeout_s: float = 10.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.server = server.rstrip("/")
        self.namespace = namespace
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._session = requests.Session()
        # A pod's HTTP(S)_PROXY is for the outside world; the API server is reached directly, with its own CA.
        self._session.trust_env = False

    @classmethod
    def in_cluster(
        cls, account_dir: Path = SERVICE_ACCOUNT_DIR, environ: Mapping[str, str] = os.environ, **options: float
    ) -> KubernetesApi:
        """The client of the API server of the pod this runs in, as its service account (``options``: the
        constructor's)."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubernetesError(
                "KUBERNETES_SERVICE_HOST/PORT are not set: this is not a Kubernetes pod — run it in one "
                "(the chart's retrain trigger), or set retrain.launcher to local"
            )
        missing = [name for name in ("token", "ca.crt", "namespace") if not (account_dir / name).is_file()]
        if missing:
            raise KubernetesError(
                f"no service account in {account_dir} ({', '.join(missing)} missing): give the pod a "
                "ServiceAccount with automountServiceAccountToken: true"
            )
        address = f"[{host}]" if ":" in host else host  # an IPv6 cluster's service address
        namespace = (account_dir / "namespace").read_text().strip()
        return cls(f"https://{address}:{port}", namespace, account_dir / "token", account_dir / "ca.crt", **options)

    def create(self, resource: Resource, body: dict) -> Created:
        """Create ``body`` (named by its ``metadata.name``) as a ``resource`` in this namespace; an object of that name
        already there is reported as ``Created(created=False)``. KubernetesError when the server cannot be reached or
        refuses it."""
        path = resource.collection(self.namespace)
        name = body["metadata"]["name"]
        attempt = 0
        while True:
            attempt += 1
            last = attempt >= self.attempts
            try:
                response = self._session.post(
                    self.server + path,
                    json=body,
                    timeout=self.timeout_s,
                    verify=str(self.ca_file),
                    headers={"Authorization": f"Bearer {self.token_file.read_text().strip()}"},
                )
            except requests.exceptions.SSLError as err:
                raise KubernetesError(
                    f"{self.server} is not the API server {self.ca_file} vouches for ({err}): check "
                    "the service account's ca.crt and KUBERNETES_SERVICE_HOST"
                ) from err
            except (requests.ConnectionError, requests.Timeout) as err:
                if last:
                    raise KubernetesError(
                        f"POST {path} to {self.server} got no answer after {self.attempts} attempts "
                        f"({err}): is the API server reachable from the pod?"
                    ) from err
            else:
                if response.status_code in (200, 201, 202):
                    return Created(name, self.namespace, True)
                if response.status_code == 409:
                    return Created(name, self.namespace, False)
                if response.status_code not in RETRIED_STATUSES or last:
                    raise KubernetesError(
                        f"POST {path} {name}: {response.status_code} {_status_message(response)} — "
                        f"{_FIXES.get(response.status_code, 'see the API server’s message')}"
                    )
            time.sleep(self.backoff_s * 2 ** (attempt - 1))


def _status_message(response: requests.Response) -> str:
    """The message of a ``Status`` object the API server answers with, else its text."""
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text.strip()[:500]
