"""The Slurm keys the controller creates when nobody named them (docs/decisions/0188)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import pytest

from gpufleet.kubeapi import ApiError, Json, Resource
from gpufleet.lifecycle.generated_secrets import GeneratedSecret, ensure, ensure_until_done

from .fakes import FakeKube

MUNGE = GeneratedSecret("g-munge-key", "munge.key", 1024)
JWT = GeneratedSecret("g-slurm-jwt", "jwt_hs256.key", 64)


def test_parse_reads_name_key_and_length() -> None:
    assert GeneratedSecret.parse("g-munge-key:munge.key:1024") == MUNGE


@pytest.mark.parametrize(
    "text",
    ["g-munge-key:munge.key", "G_Munge:munge.key:64", "g:munge key:64", "g:k:16", "g:k:x"],
)
def test_parse_refuses_what_is_not_a_secret(text: str) -> None:
    with pytest.raises(ValueError):
        GeneratedSecret.parse(text)


def test_a_missing_key_is_created_with_random_letters_and_digits() -> None:
    kube = FakeKube()
    assert asyncio.run(ensure(kube, "ns", [MUNGE, JWT])) == [MUNGE.name, JWT.name]
    munge = base64.b64decode(kube.secrets[("ns", MUNGE.name)]["data"]["munge.key"])
    jwt = base64.b64decode(kube.secrets[("ns", JWT.name)]["data"]["jwt_hs256.key"])
    assert len(munge) == 1024 and munge.isalnum() and len(jwt) == 64 and jwt.isalnum()
    assert MUNGE.manifest("ns")["data"] != MUNGE.manifest("ns")["data"]  # fresh each time


def test_an_existing_key_is_kept_as_it_is() -> None:
    kube = FakeKube()
    kube.secrets[("ns", MUNGE.name)] = {"data": {"munge.key": "b2xk"}}
    assert asyncio.run(ensure(kube, "ns", [MUNGE, JWT])) == [JWT.name]
    assert kube.secrets[("ns", MUNGE.name)] == {"data": {"munge.key": "b2xk"}}
    assert asyncio.run(ensure(kube, "ns", [MUNGE, JWT])) == []


class RefusingFirst(FakeKube):
    """Refuses the first ``refusals`` creates (an apiserver not ready, RBAC not bound yet)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        if self.refusals:
            self.refusals -= 1
            raise ApiError("create secret", 403, "forbidden")
        return await super().create(resource, body, namespace=namespace)


def test_a_refused_create_is_tried_again_until_done() -> None:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    kube = RefusingFirst(refusals=3)
    asyncio.run(ensure_until_done(kube, "ns", [MUNGE], delays=(1.0, 2.0), sleep=sleep))
    assert slept == [1.0, 2.0, 2.0]
    assert ("ns", MUNGE.name) in kube.secrets
