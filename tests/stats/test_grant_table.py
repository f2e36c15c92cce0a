"""GrantTable: the stats layout's grant lookup, remembered per journal generation (issue 14)."""

from __future__ import annotations

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.stats.grants import GrantTable
from nomad_plugin.stats.layout import GrantInfo
from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, share_group


def test_asks_once_per_instance_until_the_generation_moves():
    generation = [1]
    asked: list[str] = []

    def lookup(instance_id: str) -> GrantInfo | None:
        asked.append(instance_id)
        return GrantInfo("g-1") if instance_id == "a" else None

    table = GrantTable(lambda: generation[0], lookup)
    assert table("a") == GrantInfo("g-1") and table("b") is None
    assert table("a") == GrantInfo("g-1") and table("b") is None  # a None answer is remembered too
    assert asked == ["a", "b"]
    generation[0] = 2
    assert table("a") == GrantInfo("g-1")
    assert asked == ["a", "b", "a"], "a new generation must ask again"


def test_an_answer_given_while_the_journal_changed_is_not_kept():
    generation = [1]

    def lookup(instance_id: str) -> GrantInfo | None:
        generation[0] += 1  # a Reserve landed while we looked
        return None

    table = GrantTable(lambda: generation[0], lookup)
    assert table("a") is None
    assert table("a") is None
    assert generation[0] == 3, "the second call must have asked again"


def test_follows_a_real_journal_through_reserve_and_release(tmp_path):
    """Wired as the plugin wires it: the generation of the Reserver's journal."""
    cat = catalog(share_group([0], shares=4))
    reserver = Reserver(FakeBackend(), lambda: cat, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)

    def lookup(instance_id: str) -> GrantInfo | None:
        entry = reserver.holder(instance_id)
        return None if entry is None else GrantInfo(entry.grant_id)

    table = GrantTable(lambda: reserver.journal.generation, lookup)
    share = f"{card_uuid(0)}-share-1"
    assert table(share) is None
    grant = reserver.reserve([share]).container_res.envs["LINGJUN_GRANT_ID"]
    assert table(share) == GrantInfo(grant)
    assert reserver.release_grant(grant, "test")
    assert table(share) is None
