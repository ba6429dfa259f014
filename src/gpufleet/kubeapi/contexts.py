"""Which kubeconfig context a gpufleet process uses: kubectl's rule, one more variable.

A command's ``--context NAME`` (or ``GPUFLEET_CONTEXT``, as Helm's ``HELM_KUBECONTEXT``)
picks a context of the kubeconfig (``--kubeconfig``, else ``$KUBECONFIG``, else
``~/.kube/config``, else the Pod's service account); unset, the kubeconfig's
``current-context``. The CLI puts ``--context`` in the environment of its process,
so every reader of the kubeconfig in it agrees: :meth:`KubeApi.connect
<gpufleet.kubeapi.KubeApi.connect>`, the lifecycle controller's kopf login, the
provisioning service's join address and the operator verbs' user name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

ENV = "GPUFLEET_CONTEXT"


def chosen(env: Mapping[str, str] | None = None) -> str | None:
    """The context asked for (``--context`` / ``GPUFLEET_CONTEXT``), or None."""
    return (os.environ if env is None else env).get(ENV) or None


def use(context: str | None) -> None:
    """Make ``context`` the one this process uses (None: leave the choice as it is)."""
    if context:
        os.environ[ENV] = context


def name_in(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The context a parsed kubeconfig is read with: the chosen one, else its current one."""
    current = config.get("current-context")
    return chosen(env) or (str(current) if current else None)
