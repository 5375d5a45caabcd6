"""What a killed run's private engine leaves on the machine's network (tests/lanes.py removes it
before the lanes start): its bridge and the NAT rules of its subnet. A real bridge and real
iptables rules, made here under a prefix of this test's own, so no lane's engine is touched."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.dockerd_support import bridges_on_this_machine, nat_rules, \
    reclaim_stale_bridges, rules_naming, wait_for

pytestmark = [pytest.mark.docker]  # root, ip and iptables: what the Docker lanes have

PREFIX = "imtst"


def make_bridge(name: str, subnet: str) -> None:
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    for table, chain, rule in nat_rules(name, subnet):
        subprocess.run(["iptables", "-t", table, "-I", chain, "1", *rule], check=True)


def test_a_dead_engines_bridge_and_rules_go_and_a_live_ones_stay():
    dead, live = (f"{PREFIX}br{uuid.uuid4().hex[:6]}" for _ in range(2))
    make_bridge(dead, "10.239.1.0/24")
    make_bridge(live, "10.239.2.0/24")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)",
                               f"--bridge={live}"])  # as its dockerd's command line names it
    try:
        wait_for(lambda: f"--bridge={live}".encode() in Path(f"/proc/{holder.pid}/cmdline")
                 .read_bytes(), 60, "the holder's command line")  # a loaded machine
        assert len(rules_naming(dead)) == 3
        assert reclaim_stale_bridges(PREFIX) == [dead]
        assert dead not in bridges_on_this_machine() and rules_naming(dead) == []
        assert live in bridges_on_this_machine() and len(rules_naming(live)) == 3
    finally:
        holder.kill()
        holder.wait()
        reclaim_stale_bridges(PREFIX)
    assert live not in bridges_on_this_machine() and rules_naming(live) == []
