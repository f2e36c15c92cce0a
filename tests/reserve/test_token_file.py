"""The Nomad API client and a token file that changes: what is sent, what is kept, what is said.

Against the Nomad API double over HTTP, with real files: a rename over the file and an edit in place are
both followed; a new content that cannot be used (others may read it, empty) keeps the token read before
and is logged once; a file unusable from the start sends nothing until it is fixed. ``token_places`` finds
the token anywhere in ``/v1/agent/self``'s answer and names where, never what.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient, token_places
from tests.doubles.nomad_api import NomadApiDouble

FIRST, SECOND = "first-token-0a1b2c3d", "second-token-4e5f6a7b"


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double


def _write(path: Path, text: str, mode: int = 0o600, rename: bool = True) -> None:
    if rename:
        new = path.with_name(path.name + ".new")
        new.write_text(text)
        new.chmod(mode)
        os.replace(new, path)
    else:
        path.write_text(text)
        path.chmod(mode)


def _client(api: NomadApiDouble, token_file: Path) -> NomadClient:
    config = PluginConfig(nomad_address=api.address, nomad_token_file=str(token_file))
    return NomadClient(NomadApiSettings.from_config(config, {}))


def _sent(api: NomadApiDouble) -> str:
    return api.requests[-1][1]


@pytest.mark.parametrize("rename", [True, False], ids=["renamed-over", "rewritten-in-place"])
def test_each_request_sends_the_file_as_it_is_now(api: NomadApiDouble, tmp_path: Path, rename: bool) -> None:
    token_file = tmp_path / "nomad.token"
    _write(token_file, FIRST + "\n")
    client = _client(api, token_file)
    try:
        client.node_id()
        assert _sent(api) == FIRST
        _write(token_file, SECOND + "\r\n", rename=rename)
        client.node_id()
        assert _sent(api) == SECOND
        assert client.settings.token_source == "nomad_token_file"
    finally:
        client.close()


@pytest.mark.parametrize(("content", "mode", "why"), [(SECOND, 0o644, "(mode 0644)"), ("\n", 0o600, "is empty")])
def test_an_unusable_new_file_keeps_the_token_read_before_and_says_why(
    api: NomadApiDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, mode: int, why: str
) -> None:
    token_file = tmp_path / "nomad.token"
    _write(token_file, FIRST)
    client = _client(api, token_file)
    try:
        _write(token_file, content, mode)
        with caplog.at_level(logging.WARNING, logger="nomad_plugin"):
            client.node_id()
            client.node_id()
        assert _sent(api) == FIRST
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and why in warnings[0] and "what it held before is still used" in warnings[0]
        assert SECOND not in caplog.text
    finally:
        client.close()


def test_a_file_unusable_from_the_start_sends_nothing_until_it_is_fixed(api: NomadApiDouble, tmp_path: Path) -> None:
    token_file = tmp_path / "nomad.token"
    _write(token_file, FIRST, 0o640)
    client = _client(api, token_file)
    try:
        with pytest.raises(NomadApiError) as err:
            client.node_id()
        assert err.value.kind == "config" and "(mode 0640)" in str(err.value) and not api.requests
        assert FIRST not in str(err.value)
        token_file.chmod(0o600)
        client.node_id()
        assert _sent(api) == FIRST
    finally:
        client.close()


def test_token_places_name_every_place_and_nothing_else() -> None:
    body = {
        "config": {
            "Plugins": [
                {"Name": "docker", "Config": {"auth": {"token": "unrelated"}}},
                {"Name": "nomad-device-lingjun", "Config": {"nomad_token": FIRST, "card": [{"match": "0"}]}},
            ],
            "Client": {"Meta": {"note": f"copied {FIRST} here"}},
            "ACL": {"ReplicationToken": "<redacted>"},
        },
        "stats": {"client": {"node_id": "n1"}},
    }
    assert token_places(body, FIRST) == ["config.Plugins[1].Config.nomad_token", "config.Client.Meta.note"]
    assert token_places(body, SECOND) == []
    assert token_places(FIRST, FIRST) == ["the answer"]
    assert token_places({"a": FIRST}, "") == []
