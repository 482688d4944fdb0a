"""Controller election: lowest create revision leads; resignation and lease expiry hand over."""

import threading

from processes import wait_until

from gms.cluster.etcd_client import EtcdClient
from gms.nameserver.election import Election

TTL_S = 2


def test_first_candidate_leads_and_hands_over(client: EtcdClient, prefix: str):
    gained = {"a": threading.Event(), "b": threading.Event(), "c": threading.Event()}
    lost_a = threading.Event()

    def make(cid: str, **kw) -> Election:
        return Election(client, "controller", cid, ttl_s=TTL_S, prefix=prefix,
                        on_gain=gained[cid].set, **kw)

    a = make("a", on_loss=lost_a.set).start()
    wait_until(lambda: a.is_leader, 1.0)
    b = make("b").start()
    c = make("c").start()
    try:
        wait_until(lambda: b.leader_id == "a" and c.leader_id == "a", 1.0)
        assert not b.is_leader and not c.is_leader
        a.close()  # resign: the next in create-revision order takes over at once
        assert lost_a.is_set()
        assert wait_until(gained["b"].is_set, 1.0) < 0.5
        assert not c.is_leader
        b.close(resign=False)  # crash: c waits out b's lease
        took_s = wait_until(gained["c"].is_set, TTL_S + 2.0)
        assert took_s <= TTL_S + 1.0
        assert c.is_leader and c.leader_id == "c"
    finally:
        for e in (a, b, c):
            e.close()
