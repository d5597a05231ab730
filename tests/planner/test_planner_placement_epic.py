"""``epic``: bins of replicas placed on the nodes whose NICs they load least."""

from __future__ import annotations

import numpy as np

from zepp.planner.placement import place_epic


def test_epic_puts_bins_where_their_demand_is():
    p = place_epic(np.array([[10, 0], [0, 10]]), ranks=2, gpus_per_node=1, extra=0)
    assert p.slot_expert.tolist() == [[0], [1]]
    p = place_epic(np.array([[0, 10], [10, 0]]), ranks=2, gpus_per_node=1, extra=0)
    assert p.slot_expert.tolist() == [[1], [0]]


def test_epic_balances_inbound_nic_rows_over_nodes():
    # 2 nodes x 2 GPUs, 4 experts, no spare slots: four bins of one expert each. Experts 0 and 1
    # are asked by node 0 only, 2 and 3 by node 1 only: each node gets the bins of its own demand,
    # heaviest bin first, and no remote demand crosses a NIC.
    hist = np.array([[40, 30, 0, 0], [0, 0, 20, 10]])
    p = place_epic(hist, ranks=4, gpus_per_node=2, extra=0)
    assert sorted(p.slot_expert[:2].ravel().tolist()) == [0, 1]
    assert sorted(p.slot_expert[2:].ravel().tolist()) == [2, 3]
    assert p.slot_expert[:, 0].tolist() == [0, 1, 2, 3]
