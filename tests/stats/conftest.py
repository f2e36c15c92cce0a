"""Fixtures for the stats tests."""

from __future__ import annotations

import pytest

from nomad_plugin.model.card import Inventory
from nomad_plugin.model.instances import Catalog
from tests.doubles.stats_fakes import card, mig_group, share_group, whole_group


@pytest.fixture
def three_cards() -> tuple[Catalog, Inventory]:
    """Card 0 whole, card 1 split in 4 shares of 20 GiB, card 2 in 7 MIG units of 10 GiB."""
    cards = (card(0), card(1), card(2))
    catalog = Catalog(groups=(whole_group(cards[:1]), share_group(cards[1], 4, 20), mig_group(cards[2])))
    return catalog, Inventory(cards=cards)
