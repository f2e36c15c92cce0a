"""tdm shares never add up to more than the card: the split rounds down.

Three shares of a card are 33 % each (99 % in all), never 34 % (102 %: XDM
would refuse the third share's Allocate, or oversubscribe the card).
"""

from __future__ import annotations

import pytest

from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.nomad.catalog import build_catalog

from .helpers import m890p_node


def test_three_shares_are_33_percent_each():
    cat = build_catalog(m890p_node(2), PluginConfig(cards=(CardRule("1", "tdm", shares=3),)))
    (group,) = [g for g in cat.groups if g.key.name == "PPU M890P card1"]
    assert [(i.core, i.memory_gib) for i in group.instances] == [(33, 48)] * 3  # 144 GiB // 3
    assert group.attributes["share_core_percent"].value == 33


@pytest.mark.parametrize("shares", range(1, 101))
def test_shares_never_oversubscribe_the_card(shares):
    node = m890p_node(1)
    card = node.cards[0]
    (group,) = build_catalog(node, PluginConfig(default_mode="tdm", tdm_shares=shares)).groups
    instances = group.instances
    assert len(instances) == shares
    assert sum(i.core for i in instances) <= 100
    assert sum(i.memory_gib for i in instances) <= card.memory_gib
    assert {i.core for i in instances} == {100 // shares}  # as large as possible without exceeding 100 %
